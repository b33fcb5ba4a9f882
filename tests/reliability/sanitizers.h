// Which sanitizer a test is built under (GCC defines __SANITIZE_*, clang
// answers __has_feature): PKV_SANITIZED under ASan or TSan, PKV_TSAN under
// TSan. Threaded tests scale their work down by them.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PKV_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PKV_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define PKV_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PKV_TSAN 1
#endif
#endif
