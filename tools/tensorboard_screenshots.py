"""Screenshots of TensorBoard's dashboards for a log directory, taken with headless Chromium.

Starts ``tensorboard --logdir LOGDIR --host 127.0.0.1 --port <free port>`` (this machine only), waits until it
lists the runs, opens each dashboard (custom scalars, HParams, time series, scalars, images, the images filtered to the
``nsv/summary`` cards, text by default) in
headless Chromium, writes ``<out>/<dashboard>.png`` and stops the server, also when a step fails or times out.

    python tools/tensorboard_screenshots.py runs/digits_mlp --out /tmp/shots
    python tools/tensorboard_screenshots.py runs/sv_vs_m/tensorboard --tabs images text --window-size 1400,1800

Chromium: the first of ``chromium``/``chromium-browser``/``google-chrome`` on PATH; ``--install`` runs
``apt-get update && apt-get install -y chromium`` (Debian, as root) when there is none. Each screenshot waits
``--budget-ms`` for the dashboard's scripts to draw. The browser is driven through the DevTools protocol over a
pipe (no package needed), which turns TensorBoard's "Ignore outliers in chart scaling" off first (see
:data:`LOCAL_STORAGE`).
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

DASHBOARDS = {"custom_scalars": "#custom_scalars&_smoothingWeight=0", "hparams": "#hparams",
              "timeseries": "#timeseries", "scalars": "#scalars&_smoothingWeight=0", "images": "#images",
              "summary_card": "#images&tagFilter=summary", "text": "#text"}
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


INSTALL = (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"])


def find_browser(explicit: str | None = None, install: bool = False) -> str:
    """The browser's path; with ``install``, Chromium is installed with apt-get first where none is found."""
    names = [explicit] if explicit else BROWSERS
    for attempt in range(2):
        for name in names:
            path = shutil.which(name)
            if path:
                return path
        if not install or explicit or attempt:
            break
        for command in INSTALL:
            print("no Chromium found: " + " ".join(command), flush=True)
            if subprocess.run(command).returncode:
                raise RuntimeError(f"`{' '.join(command)}` failed: install Chromium by hand, or pass --browser PATH")
    raise FileNotFoundError(f"no Chromium found (tried {', '.join(names)}): pass --install (apt-get install -y "
                            "chromium), install it by hand, or pass --browser PATH")


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


#: TensorBoard settings kept in the browser's localStorage, set before each dashboard loads. "Ignore outliers in chart
#: scaling" (on by default) scales a chart to the 5-95 % quantiles of its values, which leaves out the lowest and
#: the highest point of a series of fewer than 21: a chart of two analyses then shows axes and no line.
LOCAL_STORAGE = {"_ignoreYOutliers": "false"}


class _DevTools:
    """The Chrome DevTools protocol over ``--remote-debugging-pipe`` (file descriptors 3 and 4 of the browser;
    messages are JSON ended by a NUL byte), so that no websocket client is needed."""

    def __init__(self, command: list[str], timeout: float) -> None:
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()

        def as_fds_3_and_4() -> None:  # in the child: dup first, so that both lose close-on-exec
            read, write = os.dup(to_browser), os.dup(from_browser)
            os.dup2(read, 3)
            os.dup2(write, 4)

        # close_fds=False: subprocess would close 3 and 4 after preexec_fn (Python's own fds are not inherited)
        self.process = subprocess.Popen(command + ["--remote-debugging-pipe"], preexec_fn=as_fds_3_and_4,
                                        close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        os.close(to_browser)
        os.close(from_browser)
        self.deadline, self._buffer, self._next_id = time.monotonic() + timeout, b"", 0

    def send(self, method: str, session: str | None = None, **params) -> dict:
        import select

        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                left = self.deadline - time.monotonic()
                if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                    raise TimeoutError(f"Chromium did not answer {method} in time")
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium exited while asked {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"Chromium refused {method}: {reply['error']}")
                return reply["result"]

    def close(self) -> None:
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
        _stop(self.process, grace=5.0)


def screenshot(browser: str, url: str, path: Path, window_size: str, budget_ms: int, timeout: float) -> Path:
    """One headless-Chromium screenshot of ``url`` after ``budget_ms`` of drawing, with :data:`LOCAL_STORAGE` set
    for its origin first; the browser's process group is killed after ``timeout`` s."""
    import base64

    width, height = (int(v) for v in window_size.split(","))
    devtools = _DevTools([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          "--no-first-run", "--disable-dev-shm-usage",
                          f"--user-data-dir={path.parent / '.chromium-profile'}", f"--window-size={width},{height}",
                          "about:blank"], timeout)
    try:
        target = devtools.send("Target.createTarget", url="about:blank")["targetId"]
        session = devtools.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        devtools.send("Emulation.setDeviceMetricsOverride", session, width=width, height=height,
                      deviceScaleFactor=1, mobile=False)
        devtools.send("Page.navigate", session, url=url.split("#")[0] + "#blank")
        time.sleep(1.0)
        settings = "; ".join(f"localStorage.setItem({k!r}, {v!r})" for k, v in LOCAL_STORAGE.items())
        devtools.send("Runtime.evaluate", session, expression=settings)
        devtools.send("Page.navigate", session, url=url)
        time.sleep(budget_ms / 1000)
        data = devtools.send("Page.captureScreenshot", session, format="png")["data"]
    finally:
        devtools.close()
    path.write_bytes(base64.b64decode(data))
    return path


def take_screenshots(logdir: str | Path, out: str | Path, tabs: Sequence[str] = tuple(DASHBOARDS),
                     window_size: str = "1400,1000", budget_ms: int = 8000, startup_timeout: float = 90.0,
                     shot_timeout: float = 120.0, browser: str | None = None, install: bool = False) -> list[Path]:
    """Start TensorBoard on ``logdir``, write ``<out>/<tab>.png`` for each of ``tabs``, always stop the server."""
    unknown = [tab for tab in tabs if tab not in DASHBOARDS]
    if unknown:
        raise ValueError(f"tabs can be {', '.join(DASHBOARDS)}, got {', '.join(unknown)}")
    if not Path(logdir).is_dir():
        raise FileNotFoundError(f"log directory {logdir} does not exist")
    browser = find_browser(browser, install)
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
    parser.add_argument("--budget-ms", type=int, default=8000, help="time for each dashboard to draw")
    parser.add_argument("--startup-timeout", type=float, default=90.0, help="seconds to wait for the server")
    parser.add_argument("--shot-timeout", type=float, default=120.0, help="seconds allowed per screenshot")
    parser.add_argument("--browser", default=None, help="Chromium executable (default: the first on PATH)")
    parser.add_argument("--install", action="store_true", help="apt-get install chromium when none is found")
    args = parser.parse_args(argv)
    return take_screenshots(args.logdir, args.out, args.tabs, args.window_size, args.budget_ms,
                            args.startup_timeout, args.shot_timeout, args.browser, args.install)


if __name__ == "__main__":
    main()
