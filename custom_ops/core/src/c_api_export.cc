// Anchor translation unit for libheterps_table.so: the C API itself comes from heterps_core, linked
// whole-archive so every extern "C" symbol is exported.
#include "heterps/c_api.h"
