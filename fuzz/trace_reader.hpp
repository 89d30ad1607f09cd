/**
 * @file trace_reader.hpp
 * @brief Fuzz target `trace_reader`: the input is the bytes of a trace file
 *        (include/dhisparse/trace.hpp, docs/trace.md).
 *
 * The reader must reject a damaged file with `dhisparse::error` or return its steps. On
 * top of "no crash, no undefined behaviour, no allocation beyond libFuzzer's limit" the
 * harness checks what the reader promises:
 *
 * - a rejected record leaves the caller's record untouched, and reading on after it is
 *   refused until `rewind`;
 * - reading again after `rewind` returns the same steps (or the same rejection);
 * - opening with the file's own shape succeeds, with another shape fails;
 * - a file read in full, written again step by step with `trace::writer`, gives the same
 *   bytes (the reader accepts only what the writer writes, and loses nothing).
 */
#pragma once

#include "fuzz_input.hpp"
#include "random_trace.hpp"  // tests/trace: scratch_file, same_record

#include <dhisparse/error.hpp>
#include <dhisparse/trace.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dhisparse::fuzz {

inline void write_file(std::string const& path, std::uint8_t const* data, std::size_t size)
{
  std::FILE* f = std::fopen(path.c_str(), "wb");
  expect(f != nullptr, "harness: cannot create " + path);
  bool const ok = size == 0 || std::fwrite(data, 1, size, f) == size;
  expect(std::fclose(f) == 0 && ok, "harness: cannot write " + path);
}

inline std::vector<std::uint8_t> read_file(std::string const& path)
{
  std::vector<std::uint8_t> out;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  expect(f != nullptr, "harness: cannot open " + path);
  std::uint8_t chunk[4096];
  for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) { out.insert(out.end(), chunk, chunk + n); }
  std::fclose(f);
  return out;
}

/// Every step of `r` from the start; `rejected` tells whether a record was rejected (and
/// then the steps before it are returned).
inline std::vector<trace::step_record> read_steps(trace::reader& r, bool& rejected)
{
  std::vector<trace::step_record> steps;
  trace::step_record const sentinel{~std::uint64_t{0}, {trace::request_record{request_id{7}, 1, 1, 0}}, {3}, {}};
  rejected = false;
  for (;;) {
    trace::step_record rec = sentinel;
    try {
      if (!r.next(rec)) { break; }
    } catch (::dhisparse::error const&) {
      expect(test::same_record(rec, sentinel), "a rejected record changed the caller's record");
      bool refused = false;
      try {
        r.next(rec);
      } catch (::dhisparse::error const&) {
        refused = true;
      }
      expect(refused, "reading on after a rejected record was not refused");
      rejected = true;
      break;
    }
    expect(rec.step == steps.size(), "record " + std::to_string(steps.size()) + " carries step " +
                                       std::to_string(rec.step));
    steps.push_back(std::move(rec));
  }
  return steps;
}

/// Target `trace_reader` (see the file comment).
inline void trace_reader_target(std::uint8_t const* data, std::size_t size)
{
  static test::scratch_file const file("fuzz"), copy("fuzz_copy");  // removed at exit
  write_file(file.path(), data, size);
  trace::reader r(file.path());  // a rejected header, size or checksum ends the input here
  trace::shape const s = r.shape();

  bool rejected     = false;
  auto const steps  = read_steps(r, rejected);
  r.rewind();
  bool again        = false;
  auto const steps2 = read_steps(r, again);
  expect(again == rejected && steps2.size() == steps.size(), "reading after rewind gave another outcome");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    expect(test::same_record(steps[i], steps2[i]), "reading after rewind gave another step " + std::to_string(i));
  }

  trace::reader same(file.path(), s);
  trace::shape other = s;
  other.scores       = !other.scores;
  bool refused       = false;
  try {
    trace::reader wrong(file.path(), other);
  } catch (::dhisparse::error const&) {
    refused = true;
  }
  expect(refused, "opening with another shape was not refused");

  if (rejected) { return; }
  expect(steps.size() == r.steps(), "the reader returned " + std::to_string(steps.size()) + " of " +
                                      std::to_string(r.steps()) + " declared steps");
  try {
    trace::writer w(copy.path(), s);
    for (auto const& rec : steps) { w.write(rec.view()); }
    w.close();
  } catch (::dhisparse::error const& e) {
    throw finding(std::string("the writer rejected what the reader accepted: ") + e.what());
  }
  expect(read_file(copy.path()) == std::vector<std::uint8_t>(data, data + size),
         "a file read in full and written again differs from the original");
}

}  // namespace dhisparse::fuzz
