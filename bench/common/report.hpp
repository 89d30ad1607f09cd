/**
 * @file bench/common/report.hpp
 * @brief Benchmark plumbing that needs no CUDA: the shared command line, medians, the
 *        date, and the small JSON writer (plain C++, so CPU-only tools such as
 *        bench/drift_calibrate use it too; bench.cuh includes it).
 */
#pragma once

#include <dhisparse/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace dhisparse::bench {

/// Command line shared by every benchmark: `--json FILE`, `--reps N`, `--quick`.
struct options {
  std::string json_path;
  int reps   = 20;     ///< timed repetitions (median reported), at least 10 by default
  int warmup = 3;
  bool quick = false;  ///< smaller sizes, for a smoke run

  static options parse(int argc, char** argv)
  {
    options o;
    for (int i = 1; i < argc; ++i) {
      std::string const a = argv[i];
      if (a == "--json" && i + 1 < argc) {
        o.json_path = argv[++i];
      } else if (a == "--reps" && i + 1 < argc) {
        o.reps = std::max(1, std::atoi(argv[++i]));
      } else if (a == "--quick") {
        o.quick = true;
      } else if (a == "--help" || a == "-h") {
        std::printf("usage: %s [--json FILE] [--reps N] [--quick]\n", argv[0]);
        std::exit(0);
      } else {
        std::fprintf(stderr, "unknown argument: %s\n", a.c_str());
        std::exit(2);
      }
    }
    return o;
  }
};

/// Median of a sample (by value: the sample is sorted).
inline double median(std::vector<double> v)
{
  if (v.empty()) { return 0.0; }
  std::sort(v.begin(), v.end());
  std::size_t const n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Today's date, YYYY-MM-DD (UTC), for reports.
inline std::string today()
{
  std::time_t const t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

/**
 * @brief Minimal JSON output: a document with a few top-level fields and a list of flat
 *        records (string or number values), which is all our benchmarks emit.
 */
class json_report {
 public:
  using record = std::vector<std::pair<std::string, std::string>>;  // key → JSON literal

  explicit json_report(std::string benchmark) { set("benchmark", std::move(benchmark)); }

  void set(std::string const& key, std::string const& value) { top_.emplace_back(key, quote(value)); }
  void set(std::string const& key, double value) { top_.emplace_back(key, number(value)); }

  /// Starts a new record; add fields with `field`.
  void add_record() { records_.emplace_back(); }
  void field(std::string const& key, std::string const& value)
  {
    records_.back().emplace_back(key, quote(value));
  }
  void field(std::string const& key, char const* value) { field(key, std::string(value)); }
  void field(std::string const& key, double value) { records_.back().emplace_back(key, number(value)); }

  std::string str() const
  {
    std::ostringstream os;
    os << "{\n";
    for (auto const& [k, v] : top_) { os << "  " << quote(k) << ": " << v << ",\n"; }
    os << "  \"records\": [\n";
    for (std::size_t i = 0; i < records_.size(); ++i) {
      os << "    {";
      for (std::size_t j = 0; j < records_[i].size(); ++j) {
        os << (j ? ", " : "") << quote(records_[i][j].first) << ": " << records_[i][j].second;
      }
      os << "}" << (i + 1 < records_.size() ? "," : "") << "\n";
    }
    os << "  ]\n}\n";
    return os.str();
  }

  /// Writes the document to `path` (no-op for an empty path).
  void write(std::string const& path) const
  {
    if (path.empty()) { return; }
    std::ofstream f(path);
    DHISPARSE_EXPECTS(f.good(), "json_report: cannot open '" + path + "'");
    f << str();
    std::printf("wrote %s\n", path.c_str());
  }

 private:
  static std::string quote(std::string const& s)
  {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') { out += '\\'; }
      out += c;
    }
    return out + "\"";
  }
  /// Integers (row and byte counts) exactly, other values to 9 significant digits.
  static std::string number(double v)
  {
    char buf[64];
    if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
      std::snprintf(buf, sizeof buf, "%.0f", v);
    } else {
      std::snprintf(buf, sizeof buf, "%.9g", v);
    }
    return buf;
  }
  std::vector<std::pair<std::string, std::string>> top_;
  std::vector<record> records_;
};

}  // namespace dhisparse::bench
