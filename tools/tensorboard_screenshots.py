"""Screenshots of TensorBoard's dashboards for a log directory, taken with headless Chromium.

Starts ``tensorboard --logdir LOGDIR --host 127.0.0.1 --port <free port>`` (this machine only), waits until it
lists the runs, opens each dashboard (time series, scalars, images, text by default) in headless Chromium, writes
``<out>/<dashboard>.png`` and stops the server, also when a step fails or times out.

    python tools/tensorboard_screenshots.py runs/digits_mlp --out /tmp/shots
    python tools/tensorboard_screenshots.py runs/sv_vs_m/tensorboard --tabs images text --window-size 1400,1800

Chromium: ``apt-get install -y chromium`` (Debian) if ``chromium``/``chromium-browser``/``google-chrome`` is
missing. Each screenshot waits ``--budget-ms`` of page time for the dashboard's scripts to draw.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

DASHBOARDS = {"timeseries": "#timeseries", "scalars": "#scalars", "images": "#images", "text": "#text"}
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def tensorboard_command(logdir: str | Path, port: int, host: str = "127.0.0.1") -> list[str]:
    """The server's command line: one host (never ``--bind_all``), no reload while the screenshots are taken."""
    return [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", host, "--port", str(port),
            "--reload_interval", "0", "--load_fast", "false"]


def find_browser(explicit: str | None = None) -> str:
    for name in ([explicit] if explicit else BROWSERS):
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError(f"no Chromium found (tried {', '.join([explicit] if explicit else BROWSERS)}): "
                            "`apt-get update && apt-get install -y chromium`, or pass --browser PATH")


def wait_for_runs(base: str, server: subprocess.Popen, timeout: float) -> list[str]:
    """Poll ``/data/runs`` until the server lists at least one run; raise if it exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"tensorboard exited with code {server.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{base}/data/runs", timeout=2) as response:
                runs = json.loads(response.read())
            if runs:
                return runs
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"tensorboard at {base} listed no runs within {timeout:.0f} s (is the log directory empty?)")


def _stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group the command started in, SIGKILL it after ``grace`` seconds."""
    if process.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def screenshot(browser: str, url: str, path: Path, window_size: str, budget_ms: int, timeout: float) -> Path:
    """One headless-Chromium screenshot of ``url``; the browser's process group is killed after ``timeout`` s."""
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={path.parent / '.chromium-profile'}",
               f"--window-size={window_size}", f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", url]
    browser_process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       start_new_session=True)
    try:
        _, errors = browser_process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"Chromium took more than {timeout:.0f} s on {url}") from None
    finally:
        _stop(browser_process, grace=5.0)
    if not path.is_file():
        raise RuntimeError(f"Chromium wrote no screenshot of {url}: {errors.decode(errors='replace')[-500:]}")
    return path


def take_screenshots(logdir: str | Path, out: str | Path, tabs: Sequence[str] = tuple(DASHBOARDS),
                     window_size: str = "1400,1000", budget_ms: int = 20000, startup_timeout: float = 90.0,
                     shot_timeout: float = 120.0, browser: str | None = None) -> list[Path]:
    """Start TensorBoard on ``logdir``, write ``<out>/<tab>.png`` for each of ``tabs``, always stop the server."""
    unknown = [tab for tab in tabs if tab not in DASHBOARDS]
    if unknown:
        raise ValueError(f"tabs can be {', '.join(DASHBOARDS)}, got {', '.join(unknown)}")
    if not Path(logdir).is_dir():
        raise FileNotFoundError(f"log directory {logdir} does not exist")
    browser = find_browser(browser)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(tensorboard_command(logdir, port), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    written = []
    try:
        runs = wait_for_runs(base, server, startup_timeout)
        print(f"tensorboard on {base}: {len(runs)} runs", flush=True)
        for tab in tabs:
            path = screenshot(browser, f"{base}/{DASHBOARDS[tab]}", out / f"{tab}.png", window_size, budget_ms,
                              shot_timeout)
            print(f"wrote {path} ({path.stat().st_size // 1024} KB)", flush=True)
            written.append(path)
    finally:
        _stop(server)
        shutil.rmtree(out / ".chromium-profile", ignore_errors=True)
    return written


def main(argv: Sequence[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("logdir", help="TensorBoard log directory")
    parser.add_argument("--out", default="tensorboard_screenshots", help="folder of the PNG files")
    parser.add_argument("--tabs", nargs="+", choices=list(DASHBOARDS), default=list(DASHBOARDS))
    parser.add_argument("--window-size", default="1400,1000", help="browser window WIDTH,HEIGHT in pixels")
    parser.add_argument("--budget-ms", type=int, default=20000, help="page time for each dashboard to draw")
    parser.add_argument("--startup-timeout", type=float, default=90.0, help="seconds to wait for the server")
    parser.add_argument("--shot-timeout", type=float, default=120.0, help="seconds allowed per screenshot")
    parser.add_argument("--browser", default=None, help="Chromium executable (default: the first on PATH)")
    args = parser.parse_args(argv)
    return take_screenshots(args.logdir, args.out, args.tabs, args.window_size, args.budget_ms,
                            args.startup_timeout, args.shot_timeout, args.browser)


if __name__ == "__main__":
    main()
