// Minimal test helpers (no external test framework to fetch or build).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

static int g_failures = 0;
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)
#define CHECK_THROWS_WITH(stmt, needle)                                                                  \
  do {                                                                                                   \
    bool thrown_ = false;                                                                                \
    try {                                                                                                \
      stmt;                                                                                              \
    } catch (const std::exception& e_) {                                                                 \
      thrown_ = true;                                                                                    \
      if (std::string(e_.what()).find(needle) == std::string::npos) {                                    \
        std::fprintf(stderr, "%s:%d: message '%s' lacks '%s'\n", __FILE__, __LINE__, e_.what(), needle); \
        ++g_failures;                                                                                    \
      }                                                                                                  \
    }                                                                                                    \
    if (!thrown_) {                                                                                      \
      std::fprintf(stderr, "%s:%d: expected an exception from %s\n", __FILE__, __LINE__, #stmt);         \
      ++g_failures;                                                                                      \
    }                                                                                                    \
  } while (0)
