/* Shared by the C test programs: checks that print the library's last error and exit. */
#ifndef PORTCULLIS_TEST_CHECK_H
#define PORTCULLIS_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "portcullis.h"

/* The calling thread's last error message (a static buffer: one thread at a time). */
static const char *last_error(void) {
    static char buf[1024];
    size_t written = 0;
    if (pc_last_error_message(buf, sizeof buf, &written) != PC_OK) {
        return "(pc_last_error_message failed)";
    }
    return buf;
}

/* Fails the program unless `call` answers `expected`. */
#define EXPECT_CODE(call, expected)                                                          \
    do {                                                                                     \
        uint32_t got_ = (call);                                                              \
        if (got_ != (uint32_t)(expected)) {                                                  \
            fprintf(stderr, "%s:%d: %s answered %s (%u), expected %s: %s\n", __FILE__,       \
                    __LINE__, #call, pc_error_name(got_), got_, pc_error_name(expected),     \
                    got_ == PC_OK ? "" : last_error());                                      \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define CHECK(call) EXPECT_CODE(call, PC_OK)

#define ASSERT(cond)                                                                         \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);     \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define S(literal) (const uint8_t *)(literal), strlen(literal)

#endif
