// Writes the King James Bible of Debian's bible-kjv-text package as plain text, one verse a
// line, so that other tools (examples/text_data/kjv.py, Python's `tokenizers`) can read
// it. /usr/lib/bible.data is compressed in the "EC02" format that ../common/kjv.hpp decodes.
//
//   build/examples/kjv_text --output kjv.txt                        # "Ge1:1 In the beginning ..."
//   build/examples/kjv_text --keep_references false --output -     # the verse texts, to stdout
//
// Each line is "<Book><chapter>:<verse> <text>" (the bible program's book abbreviations,
// e.g. "1Sm3:10"), or the text alone with --keep_references false; the file's title line is
// left out. 31102 lines, ASCII, each ending in a newline.

#include <loom/config/reflect.hpp>
#include <loom/trainer/run_main.hpp>

#include "../common/kjv.hpp"

#include <cstdio>
#include <fstream>
#include <string>

/// Flags of kjv_text.
struct KjvTextArguments {
  std::string data_file = "/usr/lib/bible.data";  ///< the bible-kjv-text data file
  std::string output = "-";                       ///< where to write the text ("-": stdout)
  bool keep_references = true;                    ///< start each line with its "Ge1:1 " reference
};

int main(int argc, char** argv) {
  return loom::run_main([&] {
    const auto args = loom::parse_args<KjvTextArguments>(argc, argv);
    bool ec02 = false;
    const std::string raw = kjv::read_file(args.data_file, ec02);
    loom::check(ec02, "{} is not an EC02 bible data file (Debian's bible-kjv-text installs /usr/lib/bible.data)",
                args.data_file);
    std::string text;
    text.reserve(raw.size());
    const auto verses = kjv::split_verses(raw);
    for (const kjv::Verse& v : verses) {
      if (args.keep_references) text += v.reference + ' ';
      text += v.text;
      text += '\n';
    }
    if (args.output == "-") {
      loom::check(std::fwrite(text.data(), 1, text.size(), stdout) == text.size(), "cannot write to stdout");
    } else {
      std::ofstream out(args.output, std::ios::binary | std::ios::trunc);
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      out.close();
      loom::check(static_cast<bool>(out), "cannot write {}", args.output);
      std::fprintf(stderr, "kjv_text: %zu verses, %zu bytes -> %s\n", verses.size(), text.size(), args.output.c_str());
    }
    return 0;
  });
}
