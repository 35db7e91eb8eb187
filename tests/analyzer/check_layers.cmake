# The command's rooms include only what lies below them: model/ reads dumps (no rules, no
# sentences), rules/ decides on the model (no sentences), render/ words the report (never
# decides); report/ is the vocabulary between rules and render; debuginfo/ reads debug info for
# the model's frames (no verdicts, no sentences). Run: cmake -DROOT=<tools/ncclwatch> -P
include(${CMAKE_CURRENT_LIST_DIR}/../support/forbidden_includes.cmake)
check_forbidden_includes("${ROOT}" check_layers
  "model:rules/;render/;debuginfo/"
  "rules:render/"
  "render:rules/;debuginfo/"
  "report:rules/;render/;debuginfo/"
  "debuginfo:rules/;render/")
message(STATUS "check_layers: model < rules < render, report between, debuginfo beside: ok")
