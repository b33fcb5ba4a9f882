"""Checks a pip-installed pagedkv the way a user meets it: the package, its
bundled libpagedkv (found next to the extension, not elsewhere), py.typed, a
CPU-only build by default, and one real step.

  pip_install_check.py --smoke-only   with the interpreter of a venv that
                                      pip-installed the package (run so by
                                      scripts/test-install.sh: build isolation)
  pip_install_check.py --source DIR --work DIR
                                      pip-installs bindings/python without
                                      isolation into a scratch target first
Not collected by pytest."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap

SMOKE = textwrap.dedent(
    """
    import os, sys, numpy as np, pagedkv
    pkg = os.path.dirname(pagedkv.__file__)
    assert pkg.startswith(sys.argv[1]), pkg
    assert os.path.exists(os.path.join(pkg, "libpagedkv.so." + str(pagedkv.ABI_VERSION))), os.listdir(pkg)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    # The extension found the library next to it ($ORIGIN), not elsewhere.
    maps = open("/proc/self/maps").read()
    libs = {line.split()[-1] for line in maps.splitlines() if "libpagedkv.so" in line}
    assert libs and all(l.startswith(pkg) for l in libs), libs
    assert not pagedkv.features().cuda
    with pagedkv.Pool(num_blocks=8, block_size=16, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32") as pool:
        s = pool.create_sequence()
        s.append(list(range(3)))
        with pool.prepare([s], 3) as step:
            kv = np.ones((3, 1, 64), np.float32)
            step.cache_write(0, kv, kv)
            out = step.attention(0, np.ones((3, 1, 64), np.float32))
            assert np.allclose(out, 1.0)
    try:
        pagedkv.Pool(num_blocks=1)
    except pagedkv.InvalidArgumentError as e:
        assert "num_blocks" in str(e)
    print("pip-installed pagedkv", pagedkv.version(), "works from", pkg)
    """
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke-only", action="store_true", help="check this interpreter's install")
    ap.add_argument("--source", help="bindings/python")
    ap.add_argument("--work", help="scratch directory")
    args = ap.parse_args()
    if args.smoke_only:
        import sysconfig

        site = sysconfig.get_paths()["platlib"]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
        return subprocess.run([sys.executable, "-c", SMOKE, site], env=env).returncode
    if not (args.source and args.work):
        ap.error("--source and --work are required without --smoke-only")
    try:
        import scikit_build_core  # noqa: F401
    except ImportError:
        print("scikit-build-core is not installed (scripts/deps/python.pip lists it)", file=sys.stderr)
        return 1
    work = os.path.abspath(args.work)
    target = os.path.join(work, "site")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    # No PAGEDKV_CUDA: the default must be a CPU-only wheel (the smoke test
    # checks features().cuda) even where nvcc is on PATH.
    env.pop("PAGEDKV_CUDA", None)
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = env.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    cmd = [
        sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
        "--disable-pip-version-check", "--no-cache-dir", "--target", target,
        "-C", "build-dir=" + os.path.join(work, "build"),
        os.path.abspath(args.source),
    ]  # fmt: skip
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env=env, cwd=work)
    if r.returncode:
        return r.returncode
    env["PYTHONPATH"] = target
    return subprocess.run([sys.executable, "-c", SMOKE, target], env=env, cwd=work).returncode


if __name__ == "__main__":
    sys.exit(main())
