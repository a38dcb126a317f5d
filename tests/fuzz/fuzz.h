// Shared by the fuzz targets (tests/fuzz/*_fuzz.cc): the libFuzzer entry
// points, splitting one input into parts, scratch files, and the small real
// inputs the targets build on (a byte-level BPE tokenizer with a chat
// template, tests/fuzz/data/).
//
// Every target defines LLVMFuzzerTestOneInput and must return 0 for any
// input: bad input is an error Status, never a crash, a hang, a leak or
// undefined behaviour. With clang (FT_FUZZ=ON) libFuzzer drives the target;
// with any compiler replay_main.cc runs it over the committed corpus as a
// regression test (ctest fuzz_<name>_replay).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace ft {
class Tokenizer;
}  // namespace ft

namespace ft::fuzz {

// The input as text.
inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The input cut at every NUL byte, into at most `max_parts` parts (the last
// one keeps the rest, NULs included); fewer when there are fewer NULs.
std::vector<std::string> SplitParts(std::string_view input, size_t max_parts);

// A path in this process's scratch directory (under $TMPDIR or /tmp, made
// once per process); writing `contents` there replaces the previous file.
std::string ScratchFile(const std::string& name, std::string_view contents);

// tests/fuzz/data/<name> (the source tree's, fixed at build time).
std::string DataPath(const std::string& name);

// The byte-level BPE tokenizer of tests/fuzz/data/, loaded once per process
// (aborts when it does not load: a broken fixture, not a finding).
const Tokenizer& DataTokenizer();

}  // namespace ft::fuzz
