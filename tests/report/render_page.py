#!/usr/bin/env python3
"""Opens an HTML page in headless Chromium, as a reader's browser would, and fails (exit 1) on a
console error, a script exception, a page that does not load, or any request beyond the page file
itself. Then checks what a reader of a `qkv inspect --html` page sees: the pictures of every head
of its table can be shown, its heatmaps have upright labels with room between them, hover text on
every cell and titled axes, each legend entry of a chart sits under a panel that draws its
series, and the page is of a bounded size; and writes a screenshot of the whole page, after a
click on HEAD ("L1H0") if given.

    render_page.py PAGE.html SCREENSHOT.png [HEAD]

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


# What the page looks like to its reader, measured in it: every heatmap on show, then, for each head
# of the page's table (layer, head) whose pictures are not on show, the same after a click on the
# link or button named after it ("L1H0"), if there is one. A heatmap is measured once.
MEASURE = r"""
(async () => {
  const shown = e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const heatmaps = () => [...document.querySelectorAll('svg')]
    .filter(s => s.querySelector('g[shape-rendering="crispEdges"]') && shown(s));
  const measured = new Set(), rotated = [], overlaps = [], hovers = [];
  let cells = 0, titled = 0, axisTitles = 0;
  const measure = () => {
    for (const svg of heatmaps()) {
      if (measured.has(svg)) continue;
      measured.add(svg);
      for (const t of svg.querySelectorAll('text')) {
        if (t.textContent.endsWith('↓') || t.textContent.endsWith('→')) { axisTitles++; continue; }
        if ((t.getAttribute('transform') || '').includes('rotate')) rotated.push(t.textContent);
      }
      for (const r of svg.querySelectorAll('g[shape-rendering="crispEdges"] > rect')) {
        cells++;
        if (r.querySelector('title')) titled++;
      }
      hovers.push(...[...svg.querySelectorAll('rect > title')].map(t => t.textContent));
      // Upright labels of one row must not run into each other, nor run together: between two
      // neighbours at least 0.3 em, about a space, so that "21" "12" do not read "2112".
      const labels = [...svg.querySelectorAll('text[text-anchor="middle"]')]
        .filter(t => !t.textContent.endsWith('→') && !t.getAttribute('transform'));
      const rows = new Map();
      for (const t of labels) {
        const b = t.getBBox(), key = Math.round(b.y);
        if (!rows.has(key)) rows.set(key, []);
        rows.get(key).push({x: b.x, width: b.width, gap: 0.3 * parseFloat(getComputedStyle(t).fontSize)});
      }
      for (const boxes of rows.values()) {
        boxes.sort((a, b) => a.x - b.x);
        for (let i = 1; i < boxes.length; i++)
          if (boxes[i].x < boxes[i - 1].x + boxes[i - 1].width + Math.max(boxes[i].gap, boxes[i - 1].gap))
            overlaps.push(svg.querySelector('text').textContent);
      }
    }
  };
  const pictured = name => heatmaps().some(s => s.querySelector('text').textContent.startsWith(name + ' '));
  measure();
  // The heads of the table, as the pictures' titles name them.
  const heads = [];
  const table = [...document.querySelectorAll('table')]
    .find(t => [...t.querySelectorAll('th')].map(h => h.textContent).join(' ').startsWith('layer head'));
  for (const row of table ? table.querySelectorAll('tr') : []) {
    const cell = [...row.querySelectorAll('td')].map(c => c.textContent);
    if (cell.length >= 2 && /^\d+$/.test(cell[0]) && /^\d+$/.test(cell[1])) heads.push('L' + cell[0] + 'H' + cell[1]);
  }
  const unreachable = [];
  for (const name of heads) {
    if (!pictured(name)) {
      const link = [...document.querySelectorAll('a, button')].find(e => e.textContent.trim() === name);
      if (link) {
        link.click();
        await new Promise(done => setTimeout(done, 50));
      }
    }
    if (!pictured(name)) unreachable.push(name);
    measure();
  }
  // The page as first shown, for the screenshot: its first head.
  const first = heads.length && [...document.querySelectorAll('a, button')].find(e => e.textContent.trim() === heads[0]);
  if (first) first.click();
  // Charts of lines: each entry of a legend sits under a panel (a frame) that draws its series,
  // as a line titled "PANEL / SERIES" (or "SERIES" in a chart of one panel).
  const misplaced = [];
  for (const chart of document.querySelectorAll('svg')) {
    const lines = [...chart.querySelectorAll('polyline > title')].map(t => ({title: t.textContent, box: t.parentNode.getBBox()}));
    if (!lines.length) continue;
    const frames = [...chart.querySelectorAll('rect[fill="none"]')].map(f => f.getBBox());
    const inside = (b, f) => b.x >= f.x - 1 && b.x + b.width <= f.x + f.width + 1 && b.y >= f.y - 1 && b.y + b.height <= f.y + f.height + 1;
    const draws = (title, series) => title === series || title.endsWith(' / ' + series);
    for (const t of chart.querySelectorAll('text')) {
      const series = t.textContent, b = t.getBBox();
      if (!lines.some(l => draws(l.title, series)) || frames.some(f => inside(b, f))) continue;
      const above = frames.filter(f => b.x >= f.x - 40 && b.x < f.x + f.width && f.y + f.height <= b.y)
        .sort((f, g) => (g.y + g.height) - (f.y + f.height))[0];
      if (!above || !lines.some(l => draws(l.title, series) && inside(l.box, above)))
        misplaced.push(chart.querySelector('text').textContent + ': ' + series);
    }
  }
  return JSON.stringify({
    heatmaps: measured.size, cells, titled, axisTitles, rotated, overlaps: [...new Set(overlaps)],
    attentionHovers: hovers.filter(h => /^query \d+ \(.+\) → key \d+ \(.+\): /.test(h)).length,
    heads: heads.length, unreachable, misplaced,
    width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
    heading: document.querySelector('h1') ? document.querySelector('h1').textContent : ''
  });
})()
"""


# The page's Explore section as a reader drives it: what it shows now (a digest of the picture's
# cells, the step's label, the line under it, the strips' colours, the hovered token's line), and
# what its data say the hovered query attends most, decoded apart from the page's script.
EXPLORE_STATE = r"""
(() => {
  const head = document.getElementById('explore-head');
  if (!head) return JSON.stringify(null);
  const slider = document.getElementById('explore-step');
  const cells = [...document.querySelectorAll('#explore-picture rect[data-q]')].map(r => r.getAttribute('fill'));
  // A strip's colour's alpha: rgba(r, g, b, a), or rgb(r, g, b) for a = 1; 0 when it has none.
  const alpha = s => {
    const m = /rgba?\(([^)]*)\)/.exec(s.style.background);
    if (!m) return 0;
    const parts = m[1].split(',');
    return parts.length === 4 ? +parts[3] : 1;
  };
  const strip = id => [...document.querySelectorAll('#' + id + ' span')];
  const attends = strip('explore-attends'), attended = strip('explore-attended');
  const hovered = attends.findIndex(s => s.classList.contains('hovered'));
  // The hovered query's row and its key's column of the data, decoded here, apart from the page.
  let row = null, column = null;
  if (hovered >= 0) {
    const data = JSON.parse(document.getElementById('explore-data').textContent), T = data.tokens.length;
    const s = data.steps[+slider.value].attention[+head.value];
    const at = i => {
      const c = s.substr(2 * i, 2);
      return c === '~~' ? null : (data.digits.indexOf(c[0]) * 64 + data.digits.indexOf(c[1])) / 4095;
    };
    row = [], column = [];
    for (let j = 0; j < T; j++) row.push(at(hovered * T + j)), column.push(at(j * T + hovered));
  }
  return JSON.stringify({
    heads: head.options.length, steps: +slider.max + 1, head: head.value, step: slider.value,
    cells: cells.length, digest: cells.join('|'), label: document.getElementById('explore-step-label').textContent,
    about: document.getElementById('explore-about').textContent, hover: document.getElementById('explore-hover').textContent,
    hovered, row, column, blue: attends.map(alpha), red: attended.map(alpha)
  });
})()
"""


def drive_explore(browser, session):
    """Selects a head, moves the slider and hovers a token and a cell of the picture, with the
    browser's own mouse for the hovers; returns what failed (none when the page has no Explore)."""
    def state():
        return json.loads(browser.send("Runtime.evaluate", {"expression": EXPLORE_STATE, "returnByValue": True},
                                       session=session)["result"]["value"])

    def run(js):
        browser.send("Runtime.evaluate", {"expression": js}, session=session)

    def hover(selector):
        box = json.loads(browser.send("Runtime.evaluate", {"expression": """(() => {
          const e = document.querySelector(%s); e.scrollIntoView({block: 'center'});
          const r = e.getBoundingClientRect(); return JSON.stringify([r.x + r.width / 2, r.y + r.height / 2]); })()"""
                                                         % json.dumps(selector), "returnByValue": True},
                                      session=session)["result"]["value"])
        for x, y in ((0, 0), tuple(box)):  # away, then onto it: the move enters it
            browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y}, session=session)

    first = state()
    if first is None:
        return None, []
    problems = []
    if first["cells"] == 0:
        problems.append("Explore draws no picture")
    if first["heads"] > 1:
        run("(() => { const h = document.getElementById('explore-head'); h.value = h.options[h.options.length - 1].value;"
            " h.dispatchEvent(new Event('change')); })()")
        after = state()
        if after["digest"] == first["digest"] or after["about"] == first["about"]:
            problems.append("Explore: another head left the picture as it was")
    if first["steps"] > 1:
        before = state()
        run("(() => { const s = document.getElementById('explore-step'); s.value = 0; s.dispatchEvent(new Event('input')); })()")
        after = state()
        if after["digest"] == before["digest"] or after["label"] == before["label"]:
            problems.append("Explore: the slider's first step left the picture as it was (%s)" % after["label"])
    hover("#explore-attends span:last-of-type")
    after = state()
    last = round(after["cells"] ** 0.5) - 1  # the picture is T × T
    if after["hovered"] != last:
        problems.append("Explore: hovering the last token (%d) marked %d" % (last, after["hovered"]))
    # Each strip's colours are the data's: the blue one the hovered query's row (where it attends),
    # the red one its column (the queries that attend it), each cell's alpha its weight (as the
    # browser keeps it: in steps of 1/255, after the page's 3 decimals).
    for colour, weights in (("blue", after["row"]), ("red", after["column"])):
        shown = after[colour]
        if weights is None or len(shown) != len(weights):
            problems.append("Explore: no %s strip to compare" % colour)
            continue
        wrong = [j for j, w in enumerate(weights) if abs((w or 0) - shown[j]) > 1 / 255 + 0.001]
        if wrong or max(shown) <= 0:
            problems.append("Explore: the %s strip's colours differ from the data at %s (shown %s)" % (colour, wrong[:5], shown[:8]))
    if not after["hover"].startswith("query %d (" % after["hovered"]):
        problems.append("Explore: the hover line reads '%s'" % after["hover"])
    hover('#explore-picture rect[data-q="1"]')
    if state()["hovered"] != 1:
        problems.append("Explore: hovering row 1 of the picture did not mark query 1")
    return state(), problems


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    page, screenshot = sys.argv[1], sys.argv[2]
    show = sys.argv[3] if len(sys.argv) == 4 else None
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
        measured = json.loads(browser.send("Runtime.evaluate",
                                           {"expression": MEASURE, "returnByValue": True, "awaitPromise": True},
                                           session=session)["result"]["value"])
        explored, explore_problems = drive_explore(browser, session)
        problems += explore_problems
        if explored:
            measured["explore"] = {k: explored[k] for k in ("heads", "steps", "label", "hover")}
        if show:  # the screenshot of that head's pictures
            browser.send("Runtime.evaluate",
                         {"expression": "[...document.querySelectorAll('a, button')].find(e => e.textContent.trim() === %s).click()"
                          % json.dumps(show)}, session=session)
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
        problems.append("upright labels that run into each other, or together, in: %s" % measured["overlaps"][:5])
    if measured["heads"] == 0:
        problems.append("no table of the heads (layer, head)")
    if measured["unreachable"]:
        problems.append("heads whose pictures cannot be shown: %s" % measured["unreachable"])
    if measured["misplaced"]:
        problems.append("legend entries under a panel that does not draw them: %s" % measured["misplaced"][:10])
    if measured["attentionHovers"] == 0:
        problems.append("no attention cell reads 'query i (token) → key j (token): weight'")
    if size > 2_000_000:
        problems.append("the page is %d bytes" % size)
    for p in problems:
        print("render_page: FAILED: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
