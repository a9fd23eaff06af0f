# -*- Python -*- lit configuration for flashopt.
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "FLASHOPT"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py",
                   "README.md"]
config.test_source_root = os.path.dirname(__file__)
# ctest runs one lit process per test file, in parallel: each gets its own
# exec root (FLASHOPT_LIT_EXEC_ROOT), so their outputs and lit's
# .lit_test_times.txt (read at start, rewritten at exit) never race.
config.test_exec_root = os.environ.get(
    "FLASHOPT_LIT_EXEC_ROOT", os.path.join(config.flashopt_obj_root, "test"))
config.environment["FILECHECK_OPTS"] = "--enable-var-scope --dump-input=fail"

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
tool_dirs = [os.path.join(config.flashopt_obj_root, "bin"), config.llvm_tools_dir]
llvm_config.add_tool_substitutions(["flashopt-opt", "flashopt-gen", "mlir-opt"],
                                   tool_dirs)
config.substitutions.append(("%flashopt_src", config.flashopt_src_root))
config.substitutions.append(("%flashopt_obj", config.flashopt_obj_root))
config.substitutions.append(("%python", "python3"))

# Optional CUDA toolkit: ptxas-dependent tests say REQUIRES: ptxas.
ptxas = os.path.join(config.cuda_home, "bin", "ptxas") if config.cuda_home else ""
if ptxas and os.path.isfile(ptxas) and os.access(ptxas, os.X_OK):
    config.available_features.add("ptxas")
    config.substitutions.append(("%ptxas", ptxas))
