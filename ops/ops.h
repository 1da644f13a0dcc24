// Every public op of remat: include this one header to use them.
#pragma once

#include "ops/binary.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/unary.h"
