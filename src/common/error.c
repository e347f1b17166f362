/* error.c - error codes, their texts, and the per-thread detail sentence. */
#include "internal.h"

#include <stdio.h>

static _Thread_local char detail[512];

const char *opt4_strerror(int code) {
  switch (code) {
#define OPT4__ERR_TEXT(name, val, text) \
  case (val): return (text);
    OPT4_ERRNO_MAP(OPT4__ERR_TEXT)
#undef OPT4__ERR_TEXT
  case 0: return "success";
  default: return "unknown error";
  }
}

const char *opt4_err_name(int code) {
  switch (code) {
#define OPT4__ERR_NAME(name, val, text) \
  case (val): return "OPT4_E" #name;
    OPT4_ERRNO_MAP(OPT4__ERR_NAME)
#undef OPT4__ERR_NAME
  case 0: return "OPT4_OK";
  default: return "OPT4_UNKNOWN";
  }
}

const char *opt4_errdetail(void) { return detail; }

void opt4__clear_detail(void) { detail[0] = '\0'; }

int opt4__fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  return code;
}
