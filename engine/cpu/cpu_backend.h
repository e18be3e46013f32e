// The reference backend: fp32 on the CPU, OpenBLAS GEMMs, OpenMP threads.
#pragma once

#include "engine/backend.h"

// MakeCpuBackend is declared in engine/backend.h; this header exists so that
// the folder names the backend's entry point.
