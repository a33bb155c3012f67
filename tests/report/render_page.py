#!/usr/bin/env python3
"""Opens an HTML page in headless Chromium, as a reader's browser would, and fails (exit 1) on a
console error, a script exception, a page that does not load, or any request beyond the page file
itself. Then checks what a reader of a `qkv inspect --html` page sees: its heatmaps have upright
labels, hover text on every cell and titled axes, and the page is of a bounded size; and writes
a screenshot of the whole page.

    render_page.py PAGE.html SCREENSHOT.png

Chromium is driven through its DevTools protocol on a pipe (--remote-debugging-pipe: JSON
messages ending in a NUL byte, commands on fd 3, replies and events on fd 4), so nothing but the
standard library is needed.
"""
import base64
import fcntl
import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import tempfile
import time

TIMEOUT = 120  # seconds for the whole page, from the browser's start


class Browser:
    def __init__(self):
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            sys.exit("render_page: no chromium; install it with scripts/install-deps --test (Debian's chromium)")
        commands_r, self.commands_w = os.pipe()
        self.replies_r, replies_w = os.pipe()
        # Above the low descriptors, so that moving them to 3 and 4 in the child cannot clobber one.
        commands_r_high = fcntl.fcntl(commands_r, fcntl.F_DUPFD, 10)
        replies_w_high = fcntl.fcntl(replies_w, fcntl.F_DUPFD, 10)

        def child():
            os.dup2(commands_r_high, 3)
            os.dup2(replies_w_high, 4)

        self.profile = tempfile.mkdtemp(prefix="qkv-chromium-")
        self.log = open(os.path.join(self.profile, "stderr.log"), "w")
        self.process = subprocess.Popen(
            [binary, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--user-data-dir=" + self.profile, "--no-first-run", "--no-default-browser-check",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", "--disable-dev-shm-usage", "--host-resolver-rules=MAP * ~NOTFOUND",
             "about:blank"],
            preexec_fn=child, close_fds=False, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        for fd in (commands_r, replies_w, commands_r_high, replies_w_high):
            os.close(fd)
        self.buffer = b""
        self.next_id = 0
        self.events = []
        self.deadline = time.monotonic() + TIMEOUT

    def _read(self):
        """The next message from the browser."""
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.replies_r], [], [], left)[0]:
                sys.exit("render_page: the browser did not answer within %d s" % TIMEOUT)
            chunk = os.read(self.replies_r, 1 << 20)
            if not chunk:
                sys.exit("render_page: the browser exited: see " + self.log.name)
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, params=None, session=None):
        """Sends a command and returns its result, keeping the events that come before it."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.commands_w, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    sys.exit("render_page: %s failed: %s" % (method, reply["error"]))
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method):
        """Waits for the event `method`, keeping every event."""
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._read())

    def close(self):
        try:
            os.write(self.commands_w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self.process.wait(timeout=20)
        except Exception:
            self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


# What the page looks like to its reader, measured in it.
MEASURE = r"""
(() => {
  const heatmaps = [...document.querySelectorAll('svg')].filter(s => s.querySelector('rect > title'));
  const rotated = [], overlaps = [];
  let cells = 0, titled = 0, axisTitles = 0;
  for (const svg of heatmaps) {
    for (const t of svg.querySelectorAll('text')) {
      if (t.textContent.endsWith('↓') || t.textContent.endsWith('→')) { axisTitles++; continue; }
      if ((t.getAttribute('transform') || '').includes('rotate')) rotated.push(t.textContent);
    }
    for (const r of svg.querySelectorAll('rect')) {
      if (r.parentNode.getAttribute('shape-rendering') === 'crispEdges') {
        cells++;
        if (r.querySelector('title')) titled++;
      }
    }
    // Upright labels of one row must not run into each other.
    const labels = [...svg.querySelectorAll('text[text-anchor="middle"]')]
      .filter(t => !t.textContent.endsWith('→') && !t.getAttribute('transform'));
    const rows = new Map();
    for (const t of labels) {
      const b = t.getBBox(), key = Math.round(b.y);
      if (!rows.has(key)) rows.set(key, []);
      rows.get(key).push(b);
    }
    for (const boxes of rows.values()) {
      boxes.sort((a, b) => a.x - b.x);
      for (let i = 1; i < boxes.length; i++)
        if (boxes[i].x < boxes[i - 1].x + boxes[i - 1].width - 0.5) overlaps.push(svg.querySelector('text').textContent);
    }
  }
  const hovers = [...document.querySelectorAll('rect > title')].map(t => t.textContent);
  return JSON.stringify({
    heatmaps: heatmaps.length, cells, titled, axisTitles, rotated, overlaps: [...new Set(overlaps)],
    attentionHovers: hovers.filter(h => /^query \d+ \(.+\) → key \d+ \(.+\): /.test(h)).length,
    width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
    heading: document.querySelector('h1') ? document.querySelector('h1').textContent : ''
  });
})()
"""


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    page, screenshot = sys.argv[1], sys.argv[2]
    url = pathlib.Path(page).resolve().as_uri()
    size = os.path.getsize(page)
    browser = Browser()
    problems = []
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(domain + ".enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session=session)
        navigation = browser.send("Page.navigate", {"url": url}, session=session)
        if navigation.get("errorText"):
            problems.append("the page did not load: " + navigation["errorText"])
        browser.wait_for("Page.loadEventFired")
        measured = json.loads(browser.send("Runtime.evaluate", {"expression": MEASURE, "returnByValue": True},
                                           session=session)["result"]["value"])
        metrics = browser.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
        shot = browser.send("Page.captureScreenshot",
                            {"format": "png", "captureBeyondViewport": True,
                             "clip": {"x": 0, "y": 0, "width": metrics["width"], "height": min(metrics["height"], 16000),
                                      "scale": 1}},
                            session=session)
        with open(screenshot, "wb") as out:
            out.write(base64.b64decode(shot["data"]))
    finally:
        browser.close()

    for e in browser.events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
            problems.append("console %s: %s" % (params["type"], [a.get("value") for a in params.get("args", [])]))
        elif method == "Runtime.exceptionThrown":
            problems.append("exception: %s" % params.get("exceptionDetails", {}).get("text"))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
            problems.append("log %s: %s" % (params["entry"]["level"], params["entry"].get("text")))
        elif method == "Network.requestWillBeSent" and params.get("request", {}).get("url") != url:
            problems.append("a request for %s" % params["request"]["url"])
        elif method == "Network.loadingFailed":
            problems.append("a load failed: %s" % params.get("errorText"))

    print("render_page: %s, %d bytes: %s" % (page, size, json.dumps(measured)))
    if measured["heatmaps"] == 0:
        problems.append("no heatmap on the page")
    if measured["cells"] == 0 or measured["titled"] != measured["cells"]:
        problems.append("%d of %d cells have hover text" % (measured["titled"], measured["cells"]))
    if measured["axisTitles"] != 2 * measured["heatmaps"]:
        problems.append("%d axis titles for %d heatmaps" % (measured["axisTitles"], measured["heatmaps"]))
    if measured["rotated"]:
        problems.append("labels written downwards: %s" % measured["rotated"][:10])
    if measured["overlaps"]:
        problems.append("upright labels that run into each other in: %s" % measured["overlaps"][:5])
    if measured["attentionHovers"] == 0:
        problems.append("no attention cell reads 'query i (token) → key j (token): weight'")
    if size > 2_000_000:
        problems.append("the page is %d bytes" % size)
    for p in problems:
        print("render_page: FAILED: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
