//===- DoctestMain.cpp - doctest entry point for flashopt unit tests ------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// doctest's main, plus one rule: a run filtered by test-case name that runs
/// no test case fails. ctest runs every case through such a filter
/// (doctest_discover_tests), and a filter that matches nothing would
/// otherwise pass with nothing checked: a case whose name CMake cuts at a
/// ';' was registered under the cut name and never ran.
///
//===----------------------------------------------------------------------===//

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

namespace {

unsigned casesPassingFilters = 0;
bool sawRunEnd = false;

/// Records how many test cases passed the filters.
struct CountCases : doctest::IReporter {
  explicit CountCases(const doctest::ContextOptions &) {}
  void report_query(const doctest::QueryData &) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats &stats) override {
    casesPassingFilters = stats.numTestCasesPassingFilters;
    sawRunEnd = true;
  }
  void test_case_start(const doctest::TestCaseData &) override {}
  void test_case_reenter(const doctest::TestCaseData &) override {}
  void test_case_end(const doctest::CurrentTestCaseStats &) override {}
  void test_case_exception(const doctest::TestCaseException &) override {}
  void subcase_start(const doctest::SubcaseSignature &) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData &) override {}
  void log_message(const doctest::MessageData &) override {}
  void test_case_skipped(const doctest::TestCaseData &) override {}
};

REGISTER_LISTENER("flashopt-count-cases", 1, CountCases);

bool filtersByTestCase(int argc, char **argv) {
  for (int i = 1; i < argc; ++i)
    for (const char *prefix :
         {"--test-case=", "-tc=", "--dt-test-case=", "--dt-tc="})
      if (std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0)
        return true;
  return false;
}

} // namespace

int main(int argc, char **argv) {
  doctest::Context context(argc, argv);
  int rc = context.run();
  if (context.shouldExit())
    return rc;
  if (rc == 0 && sawRunEnd && casesPassingFilters == 0 &&
      filtersByTestCase(argc, argv)) {
    std::fprintf(stderr, "%s: no test case matches the --test-case filter "
                         "(nothing was checked)\n",
                 argv[0]);
    return 1;
  }
  return rc;
}
