// PKV_ASSERT_OK: a call must return PKV_OK; on failure the test stops and
// prints the call and the library's message for it.
#pragma once

#include <gtest/gtest.h>

#include "pagedkv/pagedkv.h"

#define PKV_ASSERT_OK(expr)                                              \
  do {                                                                   \
    pkv_status st_ = (expr);                                             \
    ASSERT_EQ(st_, PKV_OK) << #expr << ": " << pkv_last_error_message(); \
  } while (0)
