// Selection traces on the host: random traces round-trip bit for bit through the writer
// and the reader, with and without scores and accepted counts; every damaged or
// inconsistent file is rejected with a message that says what is wrong, and a rejected
// record leaves the caller's record untouched; the writer refuses invalid steps without
// writing any part of them.
#include <catch2/catch.hpp>

#include <dhisparse/trace.hpp>

#include "random.hpp"
#include "random_trace.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

using dhisparse::test::scratch_file;
namespace trace = dhisparse::trace;

namespace {

void write_trace(std::string const& path, trace::shape const& s, std::vector<trace::step_record> const& steps)
{
  trace::writer w(path, s);
  for (auto const& rec : steps) { w.write(rec.view()); }
  w.close();
}

std::vector<unsigned char> load(std::string const& path)
{
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void store(std::string const& path, std::vector<unsigned char> const& bytes)
{
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<char const*>(bytes.data()), std::streamsize(bytes.size()));
}

template <class T>
void poke(std::vector<unsigned char>& bytes, std::size_t offset, T value)
{
  for (std::size_t i = 0; i < sizeof(T); ++i) { bytes.at(offset + i) = (std::uint64_t(value) >> (8 * i)) & 0xFF; }
}

/// Recomputes the payload checksum after a deliberate edit, so that the edit itself is
/// what the reader has to catch.
void reseal(std::vector<unsigned char>& bytes)
{
  poke<std::uint64_t>(bytes, 56, trace::fnv1a64(bytes.data() + trace::header_bytes, bytes.size() - trace::header_bytes));
}

trace::shape random_shape(std::mt19937_64& rng, bool scores, bool accepted)
{
  return dhisparse::test::random_shape(rng, scores, accepted, 48);
}

}  // namespace

TEST_CASE("random traces round-trip bit for bit", "[trace]")
{
  auto rng = dhisparse::test::seeded_engine("trace round trip");
  for (bool scores : {false, true}) {
    for (bool accepted : {false, true}) {
      for (int rep = 0; rep < 3; ++rep) {
        trace::shape const s = random_shape(rng, scores, accepted);
        int const steps      = std::uniform_int_distribution<int>(1, 12)(rng);
        auto const source    = dhisparse::test::random_trace(rng, s, steps);
        scratch_file file("roundtrip");
        write_trace(file.path(), s, source);

        trace::reader r(file.path(), s);
        CHECK(r.shape() == s);
        REQUIRE(r.steps() == std::uint64_t(steps));
        auto const back = dhisparse::test::read_trace(file.path(), s);
        REQUIRE(back.size() == source.size());
        for (std::size_t i = 0; i < back.size(); ++i) {
          INFO("step " << i << " scores " << scores << " accepted " << accepted);
          CHECK(dhisparse::test::same_record(back[i], source[i]));
        }
        // The reader can go round again.
        trace::step_record rec;
        while (r.next(rec)) {}
        CHECK(r.position() == std::uint64_t(steps));
        r.rewind();
        REQUIRE(r.next(rec));
        CHECK(dhisparse::test::same_record(rec, source[0]));
      }
    }
  }
}

TEST_CASE("an empty trace is valid", "[trace]")
{
  scratch_file file("empty");
  trace::shape s;
  s.top_k = 16;
  write_trace(file.path(), s, {});
  trace::reader r(file.path());
  trace::step_record rec;
  rec.step = 99;
  CHECK_FALSE(r.next(rec));
  CHECK(rec.step == 99);
  CHECK(load(file.path()).size() == trace::header_bytes);
}

namespace {

/// A trace whose first step's request 0 has at least two entries in query 0 of group 0.
struct damage_fixture {
  std::mt19937_64 rng = dhisparse::test::seeded_engine("trace damage");
  trace::shape s;
  std::vector<trace::step_record> steps;
  scratch_file file{"damage"};
  std::vector<unsigned char> bytes;

  damage_fixture()
  {
    s = random_shape(rng, rng() % 2 == 0, rng() % 2 == 0);
    s.top_k = std::max(s.top_k, 4);
    do {
      steps = dhisparse::test::random_trace(rng, s, 4);
    } while (steps[0].positions[1] < 0);
    write_trace(file.path(), s, steps);
    bytes = load(file.path());
  }
  /// Byte offset of entry `e` of query 0 of request 0, group 0, in step 0.
  std::size_t entry_offset(std::size_t e) const
  {
    return trace::header_bytes + trace::step_head_bytes + steps[0].requests.size() * trace::request_entry_bytes + 4 * e;
  }
  /// Entries of query 0 of request 0 in step 0.
  std::size_t valid_entries() const
  {
    std::size_t n = 0;
    while (n < std::size_t(s.top_k) && steps[0].positions[n] >= 0) { ++n; }
    return n;
  }
  std::string reopen_error()
  {
    store(file.path(), bytes);
    try {
      trace::reader r(file.path());
      trace::step_record rec;
      while (r.next(rec)) {}
    } catch (dhisparse::error const& e) {
      return e.what();
    }
    return "no error";
  }
};

}  // namespace

TEST_CASE("damaged files are rejected with the reason", "[trace]")
{
  damage_fixture f;
  using Catch::Contains;

  SECTION("truncated inside the header")
  {
    f.bytes.resize(std::uniform_int_distribution<std::size_t>(0, trace::header_bytes - 1)(f.rng));
    CHECK_THAT(f.reopen_error(), Contains("truncated") && Contains("less than the 64-byte header"));
  }
  SECTION("truncated inside the payload")
  {
    f.bytes.resize(std::uniform_int_distribution<std::size_t>(trace::header_bytes, f.bytes.size() - 1)(f.rng));
    CHECK_THAT(f.reopen_error(), Contains("truncated: the header declares"));
  }
  SECTION("trailing bytes")
  {
    f.bytes.push_back(0x5A);
    CHECK_THAT(f.reopen_error(), Contains("1 trailing bytes after the declared payload"));
  }
  SECTION("wrong magic")
  {
    f.bytes[std::uniform_int_distribution<int>(0, 7)(f.rng)] ^= 0x20;
    CHECK_THAT(f.reopen_error(), Contains("not a dhisparse trace (wrong magic"));
  }
  SECTION("wrong version")
  {
    poke<std::uint32_t>(f.bytes, 8, 2);
    CHECK_THAT(f.reopen_error(), Contains("unsupported trace version 2 (this reader reads version 1)"));
  }
  SECTION("writer never closed")
  {
    poke<std::uint64_t>(f.bytes, 48, trace::unfinished_payload);
    CHECK_THAT(f.reopen_error(), Contains("unfinished: the writer was never closed"));
  }
  SECTION("unknown flags")
  {
    poke<std::uint32_t>(f.bytes, 32, 4);
    CHECK_THAT(f.reopen_error(), Contains("unknown header flags 4"));
  }
  SECTION("zero top_k in the header")
  {
    poke<std::uint32_t>(f.bytes, 28, 0);
    CHECK_THAT(f.reopen_error(), Contains("header field top_k = 0 is out of range"));
  }
  SECTION("checksum mismatch: one flipped payload bit")
  {
    std::size_t const at = std::uniform_int_distribution<std::size_t>(trace::header_bytes, f.bytes.size() - 1)(f.rng);
    f.bytes[at] ^= std::uint8_t(1u << (f.rng() % 8));
    CHECK_THAT(f.reopen_error(), Contains("checksum mismatch"));
  }
  SECTION("checksum mismatch: header checksum altered")
  {
    f.bytes[56] ^= 1;
    CHECK_THAT(f.reopen_error(), Contains("checksum mismatch"));
  }
  SECTION("position below -1")
  {
    poke<std::int32_t>(f.bytes, f.entry_offset(0), -2 - std::int32_t(f.rng() % 1000));
    reseal(f.bytes);
    CHECK_THAT(f.reopen_error(), Contains("step 0, group 0, request 0") && Contains("entry 0: position -") &&
                                   Contains("is below -1"));
  }
  SECTION("position beyond the request's limit")
  {
    std::size_t const last   = f.valid_entries() - 1;
    std::int32_t const limit = f.steps[0].requests[0].length;  // query 0
    poke<std::int32_t>(f.bytes, f.entry_offset(last), limit + 1 + std::int32_t(f.rng() % 5));
    reseal(f.bytes);
    CHECK_THAT(f.reopen_error(), Contains("entry " + std::to_string(last)) &&
                                   Contains("is beyond the request's limit " + std::to_string(limit)));
  }
  SECTION("unordered, repeated and -1 entries are what resolve takes: accepted")
  {
    poke<std::int32_t>(f.bytes, f.entry_offset(1), f.steps[0].positions[0]);
    poke<std::int32_t>(f.bytes, f.entry_offset(0), -1);
    reseal(f.bytes);
    CHECK(f.reopen_error() == "no error");
  }
  SECTION("more requests than max_requests")
  {
    poke<std::uint32_t>(f.bytes, trace::header_bytes + 4, std::uint32_t(f.s.max_requests + 1));
    reseal(f.bytes);
    CHECK_THAT(f.reopen_error(), Contains("step 0: " + std::to_string(f.s.max_requests + 1) +
                                          " requests, not in [0, max_requests = " +
                                          std::to_string(f.s.max_requests) + "]"));
  }
  SECTION("more queries than max_queries")
  {
    poke<std::int32_t>(f.bytes, trace::header_bytes + trace::step_head_bytes + 12, f.s.max_queries + 1);
    reseal(f.bytes);
    CHECK_THAT(f.reopen_error(), Contains("step 0, request 0") &&
                                   Contains(std::to_string(f.s.max_queries + 1) + " queries, not in [1, max_queries"));
  }
  SECTION("accepted count above the queries")
  {
    poke<std::int32_t>(f.bytes, trace::header_bytes + trace::step_head_bytes + 16, f.steps[0].requests[0].queries + 1);
    reseal(f.bytes);
    CHECK_THAT(f.reopen_error(), Contains("step 0, request 0") && Contains("accepted count"));
  }
  SECTION("a step index out of sequence")
  {
    poke<std::uint64_t>(f.bytes, trace::header_bytes + 8, 7);
    reseal(f.bytes);
    CHECK_THAT(f.reopen_error(), Contains("step 0: record carries step index 7"));
  }
  SECTION("a broken record tag")
  {
    f.bytes[trace::header_bytes] ^= 0xFF;
    reseal(f.bytes);
    CHECK_THAT(f.reopen_error(), Contains("record does not start with the STEP tag"));
  }
  SECTION("more steps declared than recorded")
  {
    poke<std::uint64_t>(f.bytes, 40, f.steps.size() + 1);
    CHECK_THAT(f.reopen_error(), Contains("step " + std::to_string(f.steps.size())) &&
                                   Contains("remain in the payload (inconsistent record)"));
  }
  SECTION("fewer steps declared than recorded")
  {
    poke<std::uint64_t>(f.bytes, 40, f.steps.size() - 1);
    CHECK_THAT(f.reopen_error(), Contains("bytes follow the last declared step"));
  }
}

TEST_CASE("the reader checks the expected shape", "[trace]")
{
  auto rng             = dhisparse::test::seeded_engine("trace shape");
  trace::shape const s = random_shape(rng, true, false);
  scratch_file file("shape");
  write_trace(file.path(), s, dhisparse::test::random_trace(rng, s, 2));
  using Catch::Contains;
  trace::shape expected = s;
  expected.top_k        = s.top_k + 1;
  CHECK_THROWS_WITH(trace::reader(file.path(), expected),
                    Contains("shape mismatch: top_k is " + std::to_string(s.top_k) + ", expected " +
                             std::to_string(s.top_k + 1)));
  expected        = s;
  expected.groups = s.groups + 2;
  CHECK_THROWS_WITH(trace::reader(file.path(), expected), Contains("shape mismatch: groups"));
  expected          = s;
  expected.accepted = true;
  CHECK_THROWS_WITH(trace::reader(file.path(), expected), Contains("shape mismatch: accepted is 0, expected 1"));
  CHECK_NOTHROW(trace::reader(file.path(), s));
}

TEST_CASE("a rejected record changes nothing and stops the reader", "[trace]")
{
  damage_fixture f;
  // Damage step 1's first request entry (queries = 0), keep the checksum valid.
  std::size_t offset = trace::header_bytes;
  for (int st = 0; st < 1; ++st) {
    std::size_t stored = 0;
    for (auto const& q : f.steps[st].requests) { stored += std::size_t(q.queries) * f.s.top_k; }
    offset += trace::step_head_bytes + f.steps[st].requests.size() * trace::request_entry_bytes +
              stored * 4 * f.s.groups * (f.s.scores ? 2 : 1);
  }
  if (f.steps[1].requests.empty()) {
    poke<std::uint64_t>(f.bytes, offset + 8, 5);  // wrong step index instead
  } else {
    poke<std::int32_t>(f.bytes, offset + trace::step_head_bytes + 12, 0);
  }
  reseal(f.bytes);
  store(f.file.path(), f.bytes);

  trace::reader r(f.file.path());
  trace::step_record rec;
  REQUIRE(r.next(rec));
  CHECK(dhisparse::test::same_record(rec, f.steps[0]));
  CHECK_THROWS_WITH(r.next(rec), Catch::Contains("step 1"));
  CHECK(dhisparse::test::same_record(rec, f.steps[0]));  // untouched
  CHECK_THROWS_WITH(r.next(rec), Catch::Contains("an earlier record was invalid"));
  r.rewind();
  REQUIRE(r.next(rec));
  CHECK(dhisparse::test::same_record(rec, f.steps[0]));
}

TEST_CASE("the writer refuses invalid steps without writing them", "[trace]")
{
  auto rng = dhisparse::test::seeded_engine("trace writer checks");
  trace::shape s = random_shape(rng, false, true);
  s.top_k        = std::max(s.top_k, 2);
  std::vector<trace::step_record> good;
  do {
    good = dhisparse::test::random_trace(rng, s, 2);
  } while (good[1].requests.empty() || good[1].positions[0] < 0);
  scratch_file file("writer");
  using Catch::Contains;
  {
    trace::writer w(file.path(), s);
    w.write(good[0].view());

    auto bad = good[1];
    bad.positions[0] = bad.requests[0].length + 1 + std::int32_t(rng() % 3);
    CHECK_THROWS_WITH(w.write(bad.view()), Contains("trace writer") && Contains("step 1, group 0, request 0") &&
                                             Contains("is beyond the request's limit"));
    bad = good[1];
    bad.requests[0].accepted = bad.requests[0].queries + 1;
    CHECK_THROWS_WITH(w.write(bad.view()), Contains("accepted count"));
    bad = good[1];
    bad.requests.push_back(bad.requests[0]);
    bad.positions.resize(s.group_entries(int(bad.requests.size())) * s.groups, -1);
    CHECK_THROWS_WITH(w.write(bad.view()), Contains("request id appears twice") || Contains("max_requests"));
    bad = good[1];
    std::vector<float> scores(bad.positions.size(), 1.0f);
    auto v   = bad.view();
    v.scores = scores.data();
    CHECK_THROWS_WITH(w.write(v), Contains("the step has scores but the trace carries none"));
    CHECK(w.steps() == 1);

    w.write(good[1].view());
    w.close();
  }
  auto const back = dhisparse::test::read_trace(file.path(), s);
  REQUIRE(back.size() == 2);
  CHECK(dhisparse::test::same_record(back[0], good[0]));
  CHECK(dhisparse::test::same_record(back[1], good[1]));
}

TEST_CASE("the checksum is FNV-1a 64", "[trace]")
{
  // Published test vectors of FNV-1a 64.
  CHECK(trace::fnv1a64("", 0) == 0xCBF29CE484222325ull);
  CHECK(trace::fnv1a64("a", 1) == 0xAF63DC4C8601EC8Cull);
  CHECK(trace::fnv1a64("foobar", 6) == 0x85944171F73967E8ull);
  // Chained calls equal one call.
  CHECK(trace::fnv1a64("bar", 3, trace::fnv1a64("foo", 3)) == trace::fnv1a64("foobar", 6));
}
