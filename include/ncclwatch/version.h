#pragma once
namespace ncclwatch {
constexpr const char* kNcclwatchVersion = "0.1.0";
}
