"""A throw-away Spark standalone cluster on 127.0.0.1 for tests (master + one worker).

Use it through the session-scoped ``standalone_cluster`` fixture of ``tests/conftest.py``::

    def test_job(standalone_cluster, tmp_path):
        result = standalone_cluster.spark_submit("jobs/dp_quantiles.py", "--config", "...")
        assert result.returncode == 0, result.stderr

or directly, e.g. from a script: ``with StandaloneCluster() as c: c.spark_submit(...)``.

The master and the worker are started with pyspark's own ``bin/spark-class`` (no separate Spark
install), on free ports chosen at start, with web UIs on free ports too, modest worker memory,
and logs under a temporary directory (``c.log_dir``). ``stop()`` (also on leaving the ``with``
block) ends exactly the two processes it started, by their pid.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["StandaloneCluster", "spark_home", "free_port", "clean_environ"]

# Set by pyspark in a process that already runs a driver; a child process that inherits them
# would talk to the parent's JVM gateway instead of starting its own, and hang.
_INHERITED_DRIVER_VARS = ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_REMOTE",
                          "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_API_MODE")


def clean_environ() -> dict:
    """``os.environ`` without the variables of this process's own Spark driver."""
    return {k: v for k, v in os.environ.items() if k not in _INHERITED_DRIVER_VARS}


def spark_home() -> Path:
    """The Spark distribution bundled with the installed pyspark."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandaloneCluster:
    """A standalone master and one worker on loopback.

    Parameters
    ----------
    worker_cores : int
        Cores the worker offers.
    worker_memory : str
        Memory the worker offers to executors (keep it modest).
    start_timeout : float
        Seconds to wait for the master to elect itself and the worker to register.
    """

    def __init__(self, worker_cores: int = 2, worker_memory: str = "2g", start_timeout: float = 90.0):
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.start_timeout = start_timeout
        self.home = spark_home()
        self.log_dir = Path(tempfile.mkdtemp(prefix="dpq_cluster_"))
        self.port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen] = []

    # environment shared by the daemons and spark-submit
    def env(self) -> dict:
        env = clean_environ()
        env.update({
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.log_dir),
            "SPARK_WORKER_DIR": str(self.log_dir / "work"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1",
        })
        return env

    def _launch(self, name: str, args: list[str]) -> tuple[subprocess.Popen, Path]:
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
            )
        self._procs.append(proc)
        return proc, log

    def _wait_for(self, proc: subprocess.Popen, log: Path, marker: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{log.name} exited early:\n{log.read_text()[-3000:]}")
            if marker in log.read_text(errors="replace"):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{log.name}: no {marker!r} within {self.start_timeout}s:\n"
                           f"{log.read_text()[-3000:]}")

    def start(self) -> "StandaloneCluster":
        """Start the master, then the worker; return when the worker has registered."""
        master, mlog = self._launch("master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(free_port()),
        ])
        self._wait_for(master, mlog, "I have been elected leader")
        worker, wlog = self._launch("worker", [
            "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
            "--port", str(free_port()), "--webui-port", str(free_port()),
            "--cores", str(self.worker_cores), "--memory", self.worker_memory,
            "--work-dir", str(self.log_dir / "work"),
        ])
        self._wait_for(worker, wlog, "Successfully registered with master")
        return self

    def spark_submit(self, script, *args, conf: dict | None = None, timeout: float = 600.0,
                     cwd=None) -> subprocess.CompletedProcess:
        """Run ``spark-submit --master <this cluster> script args...`` and return its result."""
        settings = {
            "spark.executor.memory": "1g",
            "spark.executor.cores": str(self.worker_cores),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.pyspark.python": sys.executable,
        }
        settings.update(conf or {})
        cmd = [str(self.home / "bin" / "spark-submit"), "--master", self.master_url]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += [str(script), *map(str, args)]
        return subprocess.run(cmd, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)

    def stop(self) -> None:
        """Stop the worker, then the master (only the processes started here)."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self._procs.clear()
        shutil.rmtree(self.log_dir / "work", ignore_errors=True)

    def __enter__(self) -> "StandaloneCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
