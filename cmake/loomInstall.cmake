# install(EXPORT) + loomConfig.cmake, so that find_package(loom) works from a prefix.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS loom EXPORT loomTargets FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# loom::compiled: the non-template code compiled once, with this build's compiler and torch.
install(TARGETS loom_compiled EXPORT loomTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT loomTargets NAMESPACE loom:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)

# No path of this machine goes into the installed files (the consumer test checks it): the
# config finds the dependencies where the consumer is. Only torch's version is recorded.
set(LOOM_CONFIG_TORCH_VERSION "${Torch_VERSION}")
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
