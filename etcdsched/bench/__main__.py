"""``python -m etcdsched.bench``: the same command as ``etcdsched bench``."""

from etcdsched.bench.command import bench

if __name__ == "__main__":
    bench(prog_name="python -m etcdsched.bench")
