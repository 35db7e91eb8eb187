// Moved to process/signals.h; this forward stays only until runtime/runtime.cpp includes that.
#pragma once
#include "process/signals.h"
