// Which Python frames count as library code (PythonFrame::library).
#include <catch2/catch.hpp>

#include "python_api.h"

using ncclwatch::stacks::detail::IsLibraryFile;

TEST_CASE("library frames are told from the user's own frames") {
  const std::string stdlib = "/usr/lib/python3.11";
  CHECK(IsLibraryFile("/usr/lib/python3.11/threading.py", stdlib));
  CHECK(IsLibraryFile("/usr/lib/python3.11/concurrent/futures/thread.py", stdlib));
  CHECK(IsLibraryFile("<frozen importlib._bootstrap>", stdlib));
  CHECK(IsLibraryFile("/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", stdlib));
  CHECK(IsLibraryFile("/usr/lib/python3/dist-packages/numpy/core/numeric.py", stdlib));
  CHECK(IsLibraryFile("/home/me/pytorch/torch/nn/parallel/distributed.py", stdlib));  // source checkout
  CHECK(IsLibraryFile("/home/me/DeepSpeed/deepspeed/runtime/engine.py", stdlib));
  CHECK(IsLibraryFile("/workspace/Megatron-LM/megatron/core/parallel_state.py", stdlib));
  CHECK(IsLibraryFile("torch/distributed/c10d_logger.py", stdlib));  // relative path

  CHECK_FALSE(IsLibraryFile("/home/me/train.py", stdlib));
  CHECK_FALSE(IsLibraryFile("/workspace/Megatron-LM/pretrain_gpt.py", stdlib));
  CHECK_FALSE(IsLibraryFile("/usr/lib/python3.11x/mine.py", stdlib));  // only the directory itself
  CHECK_FALSE(IsLibraryFile("/home/me/torchtune_recipes/run.py", stdlib));  // not a torch/ directory
  CHECK_FALSE(IsLibraryFile("<stdin>", stdlib));
  CHECK_FALSE(IsLibraryFile("/home/me/train.py", ""));  // standard library unknown
}
