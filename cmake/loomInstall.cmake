# install(EXPORT) + loomConfig.cmake, so that find_package(loom) works from a prefix.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS loom EXPORT loomTargets FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# loom::compiled: the non-template code compiled once, with this build's compiler and torch.
install(TARGETS loom_compiled EXPORT loomTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT loomTargets NAMESPACE loom:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)

# Hints recorded at build time; a consumer can override any of them.
set(LOOM_CONFIG_PFR_INCLUDE_DIR "${LOOM_PFR_INCLUDE_DIR}")
set(LOOM_CONFIG_TORCH_DIR "${Torch_DIR}")
configure_package_config_file(cmake/loomConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/loomConfig.cmake"
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/loomConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES
  "${CMAKE_CURRENT_BINARY_DIR}/loomConfig.cmake"
  "${CMAKE_CURRENT_BINARY_DIR}/loomConfigVersion.cmake"
  cmake/loomDependencies.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
