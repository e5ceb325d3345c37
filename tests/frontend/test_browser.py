"""A real browser: JupyterLab on 127.0.0.1 runs notebooks/01_tour.ipynb in headless Chromium.

Runs all cells; checks that the live decode workbench is on screen (and fills in) before
its decode ends, that the widgets and plotly plots rendered, that a step / node change
reaches every tab, that the Diagnostics tab and the search box work; finds no errors in
the browser console, and saves screenshots of every tab in the test's temporary folder. Skips only when Debian's
`chromium` is not installed (`apt-get install -y chromium`); playwright drives it
through `executable_path` and never downloads a browser.

The test starts exactly one process itself (the Jupyter server, in its own process
group, with its own config / runtime / data / settings / workspace folders) and stops
it by its id -- kernels it started are shut down through the server's API first.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
NOTEBOOK = Path(__file__).parents[2] / "notebooks" / "01_tour.ipynb"
#: notebook 01's live decode: 20 new tokens, so 20 steps (the prefill and 19 decode steps)
FINAL = "step 19 (20/20)"
PREV, PREV_STEP = "step 18 (19/20)", 18

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - our own local server
        return r.read()


class JupyterLab:
    """One `jupyter lab` process on 127.0.0.1 with a token and private folders."""

    def __init__(self, root: Path, home: Path, exist_ok: bool = False):
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.root = root
        dirs = {name: home / name for name in ("config", "runtime", "data", "settings", "workspaces")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=exist_ok)
        # no news / update pop-ups
        notification = dirs["settings"] / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        notification.parent.mkdir(parents=True, exist_ok=exist_ok)
        notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        # render every cell (not only those scrolled into view), so every plot is drawn
        tracker = dirs["settings"] / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
        tracker.parent.mkdir(parents=True)
        tracker.write_text(json.dumps({"windowingMode": "none"}))
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
                   JUPYTER_DATA_DIR=str(dirs["data"]), JUPYTER_PLATFORM_DIRS="1")
        self.log_path = home / "jupyter.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={self.port}", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             f"--LabApp.user_settings_dir={dirs['settings']}", f"--LabApp.workspaces_dir={dirs['workspaces']}",
             "--ServerApp.port_retries=0", "--LabApp.news_url=", "--ServerApp.terminals_enabled=False"],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}{path}{sep}token={self.token}"

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                _get(self.url("/api/status"))
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"jupyter lab did not answer within {timeout} s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                try:  # kernels first, through the server that started them
                    for k in json.loads(_get(self.url("/api/kernels"))):
                        req = urllib.request.Request(self.url(f"/api/kernels/{k['id']}"), method="DELETE")
                        urllib.request.urlopen(req, timeout=10).close()  # noqa: S310
                except OSError:
                    pass
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # the group we created, by its id
                    self.proc.wait(timeout=10)
        finally:
            self.log.close()


@pytest.fixture
def lab(tmp_path):
    root = tmp_path / "notebooks"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)  # a copy: autosave never touches the repository
    server = JupyterLab(root, tmp_path / "jupyter")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _open_notebook(browser, lab, viewport: dict, console: list[str], init_script: str | None = None):
    """A page at `viewport` on the tour notebook, its console errors and page errors
    collected into `console`, once its kernel is idle (`init_script` runs in the page
    before JupyterLab does)."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport=viewport)
    if init_script:
        page.add_init_script(init_script)
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.goto(lab.url(f"/lab/tree/{NOTEBOOK.name}"))
    # the toolbar reads idle before the kernel is ready: wait for the status bar
    expect(page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle"))).to_be_visible(timeout=90_000)
    return page


#: what plotly / ipywidgets print when a figure holds NaN (JSON has no NaN)
SERIALIZATION_WARNINGS = ("Message serialization failed", "Out of range float values are not JSON compliant")


def test_tour_notebook_renders_and_steps_in_a_real_browser(lab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    console: list[str] = []
    t0 = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = _open_notebook(browser, lab, {"width": 1920, "height": 1080}, console)
            page.locator(".lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
            page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
            notebook = page.locator(".jp-NotebookPanel:visible")

            # the live workbench is on screen while it decodes, and fills in step by step
            live_label = notebook.locator(".wb-workbench .wb-step-label").first
            live_plot = notebook.locator(".wb-workbench .js-plotly-plot .main-svg").first
            seen: list[str] = []
            plotted_at = None  # how many step labels had been seen when the first plot was drawn
            deadline = time.monotonic() + 150
            while not (seen and FINAL in seen[-1]):
                assert time.monotonic() < deadline, f"the live decode never reached its last step: {seen}"
                if live_label.count():
                    text = live_label.inner_text(timeout=5_000)
                    if not seen or seen[-1] != text:
                        seen.append(text)
                    if plotted_at is None and live_plot.count():
                        plotted_at = len(seen)
                page.wait_for_timeout(100)
            early = [t for t in seen if FINAL not in t]
            assert early, f"the workbench appeared only once its decode had ended: {seen}"
            # live visibility, in steps not seconds (these machines are noisy): the plot is on
            # screen with the first or second step label the page shows, and later steps
            # arrive with it there
            assert plotted_at is not None and FINAL not in seen[plotted_at - 1], \
                f"the first plot came only with the last step: {seen}, plotted after {plotted_at}"
            assert plotted_at <= 2 and len(seen) - plotted_at >= 2, \
                f"the plot was not on screen with the first steps shown: {seen}, plotted after {plotted_at}"
            steps_seen = {m.group(1) for t in seen for m in [re.search(r"step (\d+) \(", t)] if m}
            assert len(steps_seen) >= 3, f"the steps did not fill in as they arrived: {seen}"

            n_code = notebook.locator(".jp-CodeCell").count()
            assert n_code >= 10
            prompts = notebook.locator(".jp-CodeCell .jp-InputArea-prompt")
            deadline = time.monotonic() + 150
            while True:
                texts = prompts.evaluate_all("els => els.map(e => e.textContent)")
                if len(texts) == n_code and all(re.fullmatch(r"\[\d+\]:", t.strip()) for t in texts):
                    break
                assert time.monotonic() < deadline, f"cells did not all run: {texts}"
                page.wait_for_timeout(500)
            expect(page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle"))).to_be_visible(
                timeout=60_000)
            errors = notebook.locator("[data-mime-type='application/vnd.jupyter.error']")
            assert errors.count() == 0, errors.all_inner_texts()
            # no warning in any output (ViewAliasView's NaN padding made plotly's JSON fail)
            outputs = " ".join(notebook.locator(".jp-OutputArea-output").all_inner_texts())
            for warning in SERIALIZATION_WARNINGS:
                assert warning not in outputs, outputs

            # widgets and plotly plots rendered
            wb = notebook.locator(".wb-workbench").first
            expect(wb).to_be_visible(timeout=30_000)
            expect(wb.locator(".js-plotly-plot").first).to_be_visible(timeout=30_000)
            # 5 standalone + 6 in the tabs (Plan, Segmentation, Memo, Views, Liveness, Diagnostics)
            expect(notebook.locator(".wb-view")).to_have_count(5 + 6)
            n_plots = notebook.locator(".js-plotly-plot").count()
            assert n_plots >= 6, n_plots
            label = wb.locator(".wb-step-label")
            first_label = label.inner_text()
            assert FINAL in first_label, first_label
            plan_plot = wb.locator(".js-plotly-plot").first
            # at 1920x1080 the plan figure fills the tab's width (it stayed ~480 px wide)
            panel_w = wb.locator(".wb-view:visible").first.bounding_box()["width"]
            plot_w = plan_plot.bounding_box()["width"]
            print(f"1920x1080: plan figure {plot_w:.0f} px wide in a {panel_w:.0f} px tab")
            assert plot_w >= 0.9 * panel_w and plot_w > 1000, (plot_w, panel_w)
            plot_before = plan_plot.inner_html()
            tokens_before = wb.locator(".wb-tokens").inner_html()
            wb.locator(".wb-workbench .wb-prev, .wb-prev").first.scroll_into_view_if_needed()
            page.screenshot(path=str(tmp_path / "01_tour_workbench_before.png"))

            # move the step control: label, tokens panel and the plan plot all follow
            wb.locator(".wb-prev").first.click()
            expect(label).to_contain_text(PREV, timeout=20_000)
            deadline = time.monotonic() + 20
            while plan_plot.inner_html() == plot_before:
                assert time.monotonic() < deadline, "the plan plot did not redraw for the new step"
                page.wait_for_timeout(200)
            assert wb.locator(".wb-tokens").inner_html() != tokens_before

            # pick a node: its details appear
            wb.locator(".wb-node-pick select").select_option(index=40)
            expect(wb.locator(".wb-node-detail")).to_contain_text("#39 ", timeout=20_000)
            page.wait_for_timeout(500)
            wb.screenshot(path=str(tmp_path / "01_tab_plan.png"))

            # every tab shows the selected step (and node, where a tab is about nodes)
            step = PREV_STEP
            expect_in_tab = {
                "Segmentation": [f"Declines by reason at step {step}"],
                "Memo & capture": [f"step {step}"],
                "Views & aliases": [f"Views at step {step}"],
                "Liveness": [f"step {step}", "at node #39"],
                "Diagnostics": [],
            }
            for tab, texts in expect_in_tab.items():
                wb.locator(".lm-TabBar-tab").get_by_text(tab, exact=True).click()
                for text in texts:
                    expect(wb).to_contain_text(text, timeout=20_000)
                expect(wb.locator(".js-plotly-plot:visible").first).to_be_visible(timeout=20_000)
                page.wait_for_timeout(700)
                wb.screenshot(path=str(tmp_path / f"01_tab_{tab.split()[0].lower()}.png"))
            numbers = wb.locator(".wb-memory-numbers")
            expect(numbers).to_contain_text(f"step {step}", timeout=20_000)

            # Diagnostics: a call at the selected step, the selected node's row highlighted
            wb.locator(".wb-diagnostic-call button").get_by_text("peak values", exact=True).click()
            headline = wb.locator(".wb-diagnostic-headline")
            expect(headline).to_contain_text(f"peak values · step {step}:", timeout=20_000)
            wb.locator(".wb-diagnostic-call button").get_by_text("seam costs", exact=True).click()
            expect(headline).to_contain_text("costliest", timeout=20_000)
            wb.locator(".wb-next").first.click()  # a step change reaches the open Diagnostics tab too
            expect(label).to_contain_text(FINAL, timeout=20_000)  # the kernel has taken the step change
            wb.locator(".wb-diagnostic-call button").get_by_text("resident", exact=True).click()
            expect(headline).to_contain_text(f"step {step + 1}:", timeout=20_000)

            # the search box: every tab jumps to the node
            search = wb.locator(".wb-search input")
            search.fill("self_attn/MaskedSoftmaxAttention")
            search.press("Enter")
            expect(wb.locator(".wb-search-label")).to_contain_text("→ #", timeout=20_000)
            found = int(re.search(r"#(\d+)", wb.locator(".wb-search-label").inner_text()).group(1))
            expect(wb.locator(".wb-diagnostic-call")).to_be_visible()
            wb.locator(".lm-TabBar-tab").get_by_text("Plan", exact=True).click()
            expect(wb.locator(".wb-node-detail")).to_contain_text(f"#{found} ", timeout=20_000)
            wb.locator(".lm-TabBar-tab").get_by_text("Liveness", exact=True).click()
            expect(numbers).to_contain_text(f"at node #{found}", timeout=20_000)
            wb.locator(".lm-TabBar-tab").get_by_text("Segmentation", exact=True).click()
            expect(wb.locator(".wb-seam-detail")).to_contain_text(f"#{found} ", timeout=20_000)
            page.wait_for_timeout(500)
            wb.screenshot(path=str(tmp_path / "01_tab_segmentation_seam.png"))
            shot = tmp_path / "01_tour_workbench.png"
            wb.screenshot(path=str(shot))
            page.screenshot(path=str(tmp_path / "01_tour_page.png"))
            assert shot.stat().st_size > 20_000
        finally:
            browser.close()
    print(f"browser run {time.monotonic() - t0:.1f} s; screenshots in {tmp_path}")
    log = lab.log_path.read_text(errors="replace")  # the kernel's own stderr (a decode thread's warnings)
    assert not [w for w in SERIALIZATION_WARNINGS if w in log], log[-3000:]
    keep = os.environ.get("WORKBENCH_BROWSER_ARTIFACTS")  # e.g. a CI artifacts folder
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for png in tmp_path.glob("*.png"):
            shutil.copy(png, Path(keep) / png.name)
    assert not console, "errors in the browser console:\n" + "\n".join(console)


def _luminance(rgb: str) -> float:
    r, g, b = (int(x) / 255 for x in re.findall(r"\d+", rgb)[:3])
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(fg: str, bg: str) -> float:
    a, b = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


@pytest.fixture
def dark_lab(tmp_path):
    root = tmp_path / "notebooks"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    settings = tmp_path / "jupyter" / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "themes.jupyterlab-settings").write_text(json.dumps({"theme": "JupyterLab Dark"}))
    server = JupyterLab(root, tmp_path / "jupyter", exist_ok=True)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


#: the workbench's tabs, in order
TABS = ("Plan", "Segmentation", "Memo & capture", "Views & aliases", "Liveness", "Summary", "Diagnostics")
#: at 1366x768: the tallest tab (px; measured 970-1,240) and the lowest bottom edge of a tab's
#: first plot below the widget's top (measured ~590: header ~140, tab bar, a 400 px plot)
MAX_HEIGHT_1366, PLOT_BOTTOM_1366 = 1300, 650


def test_laptop_screen_dark_theme_and_a_rerun_live_cell(dark_lab, tmp_path):
    """1366x768, JupyterLab Dark: the live cell re-run while its decode streams shows one
    decode (never 'step 38 (39/39)'), no tab's tables or text scroll sideways or are cut
    off, plots are dark (no light background), the widget's height stays within a bound
    with each tab's first plot on the first screen, headers and the selected row are
    readable, no traceback or warning, and 'why slow?' is one click."""
    from playwright.sync_api import expect, sync_playwright

    console: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = _open_notebook(browser, dark_lab, {"width": 1366, "height": 768}, console)
            assert page.evaluate("document.body.dataset.jpThemeLight") == "false"
            notebook = page.locator(".jp-NotebookPanel:visible")
            cells = notebook.locator(".jp-CodeCell")
            cells.nth(0).click()
            page.keyboard.press("Shift+Enter")  # imports, session
            expect(cells.nth(0).locator(".jp-InputArea-prompt")).to_have_text(re.compile(r"\[\d+\]"),
                                                                                timeout=90_000)
            page.wait_for_timeout(1500)
            live_cell = cells.nth(1)
            live_cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Control+Enter")  # the live decode
            page.wait_for_timeout(1500)
            live_cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Control+Enter")  # re-run while the first decode streams
            wb = live_cell.locator(".wb-workbench").first
            label = wb.locator(".wb-step-label")
            expect(label).to_contain_text(FINAL, timeout=150_000)
            assert "(39/" not in label.inner_text() and "(21/" not in label.inner_text()
            outputs = live_cell.locator(".jp-OutputArea-output")
            text = " ".join(outputs.all_inner_texts())
            assert "Traceback" not in text and "Warning" not in text, text

            # why is my export slow: one click from the header
            wb.locator(".wb-why-slow").click()
            expect(wb.locator(".wb-diagnostic-headline")).to_contain_text("costliest", timeout=20_000)
            page.wait_for_timeout(800)
            wb.screenshot(path=str(tmp_path / "dark_1366_diagnostics.png"))
            heights = {}
            for tab in TABS:
                wb.locator(".lm-TabBar-tab").get_by_text(tab, exact=True).click()
                page.wait_for_timeout(1500)
                over = page.evaluate("""(root) => [...root.querySelectorAll(
                        '.wb-table-box, .wb-view, .wb-summary, .wb-view .widget-html-content')]
                    .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
                    .map(e => e.className + ' ' + e.scrollWidth + '>' + e.clientWidth)""", wb.element_handle())
                assert not over, f"{tab}: horizontal scroll (or text cut off) in {over}"
                assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
                # dark plots: no plot paints a light background (the template is transparent)
                light = page.evaluate("""(root) => [...root.querySelectorAll('.js-plotly-plot')]
                    .filter(g => g.offsetParent !== null).flatMap(g => [
                      ...[...g.querySelectorAll('.main-svg')].map(s => ['paper', getComputedStyle(s).backgroundColor]),
                      ...[...g.querySelectorAll('.bglayer rect.bg')].map(r => ['plot',
                          getComputedStyle(r).fillOpacity === '0' ? 'rgba(0, 0, 0, 0)' : getComputedStyle(r).fill])])
                    .filter(([_, c]) => !/rgba\\(.*, 0\\)$/.test(c))""", wb.element_handle())
                assert all(_luminance(c) < 0.2 for _, c in light), f"{tab}: light plot backgrounds {light}"
                box = wb.bounding_box()
                plot = wb.locator(".js-plotly-plot:visible").first
                plot_bottom = plot.bounding_box()["y"] + plot.bounding_box()["height"] - box["y"] if \
                    plot.count() else 0
                heights[tab] = (round(box["height"]), round(plot_bottom))
            print("workbench height at 1366x768 per tab (total, bottom of its first plot):", heights)
            # a laptop screen: the header and each tab's first plot fit in one screen of the
            # notebook (~640 px at 768); the whole widget, any tab, under 1,300 px (the issue
            # measured ~1,850; 1,620-1,640 before the compact header, row heights and summary columns)
            assert all(total <= MAX_HEIGHT_1366 for total, _ in heights.values()), heights
            assert all(bottom <= PLOT_BOTTOM_1366 for _, bottom in heights.values()), heights
            wb.locator(".lm-TabBar-tab").get_by_text("Plan", exact=True).click()
            wb.locator(".wb-node-pick select").select_option(index=3)
            page.wait_for_timeout(1500)
            th = wb.locator(".wb-tbl th:visible").first
            th_fg, th_bg = th.evaluate("e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor]")
            assert _contrast(th_fg, th_bg) >= 4.5, (th_fg, th_bg)
            sel = wb.locator(".wb-tbl tr.wb-sel td:visible").first
            s_fg, s_bg = sel.evaluate("e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor]")
            assert _contrast(s_fg, s_bg) >= 4.5, (s_fg, s_bg)
            wb.screenshot(path=str(tmp_path / "dark_1366_plan.png"))
        finally:
            browser.close()
    log = dark_lab.log_path.read_text(errors="replace")
    assert not [w for w in SERIALIZATION_WARNINGS if w in log], log[-3000:]
    keep = os.environ.get("WORKBENCH_BROWSER_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for png in tmp_path.glob("*.png"):
            shutil.copy(png, Path(keep) / png.name)
    assert not console, "errors in the browser console:\n" + "\n".join(console)


#: in the page: every frame the DOM changed, what each live workbench shows (sampled in
#: requestAnimationFrame, i.e. what the next paint puts on screen): its decode's start (the
#: kernel's clock, `wb-live-clock`), the step label, the plan plot's title, the highlighted token
LIVE_SAMPLER = r"""
window.__wbSamples = [];
const wbSample = () => {
  for (const wb of document.querySelectorAll('.wb-workbench')) {
    const clock = wb.querySelector('.wb-live-clock [data-started-ms]');
    if (!clock) continue;
    const label = wb.querySelector('.wb-step-label');
    const fig = wb.querySelector('.wb-figure .js-plotly-plot');
    const title = fig && fig.offsetParent !== null ? fig.querySelector('.gtitle') : null;
    const cur = wb.querySelector('.wb-tokens .wb-tok-current');
    const s = {started: +clock.dataset.startedMs, label: label ? label.innerText : '',
               title: title ? title.textContent : '', tok: cur ? cur.textContent : ''};
    const key = JSON.stringify(s), samples = window.__wbSamples;
    if (samples.length && samples[samples.length - 1].key === key) continue;
    samples.push({t: Date.now(), key, ...s});
  }
};
let wbQueued = false;
new MutationObserver(() => {
  if (!wbQueued) { wbQueued = true; requestAnimationFrame(() => { wbQueued = false; wbSample(); }); }
}).observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
"""

#: first plot of a live decode, seconds after its decode started, at most (measured on this
#: noisy 2-core machine: 0.5-0.8 s cold and warm; a widget that draws only once its decode
#: has ended (6 s here) shows it at the end)
FIRST_PLOT_S = 2.0


def _live_timeline(samples: list[dict]) -> dict:
    """The samples of the newest live decode -> when its first label / plot showed (s after
    the decode started), and each sample's (label step, label token, plot step, highlighted token)."""
    started = max(s["started"] for s in samples)
    mine = [s for s in samples if s["started"] == started]
    rows = []
    for s in mine:
        label = re.search(r"step (\d+) \(.*?token (\d+)", s["label"])
        plot = re.search(r"at step (\d+)", s["title"])
        rows.append(((s["t"] - started) / 1e3, label and int(label.group(1)), label and label.group(2),
                     plot and int(plot.group(1)), s["tok"] or None))
    first_label = next((r[0] for r in rows if r[1] is not None), None)
    first_plot = next((r[0] for r in rows if r[3] is not None), None)
    final = next((r[0] for r in rows if r[1] == PREV_STEP + 1), None)
    return {"rows": rows, "first_label_s": first_label, "first_plot_s": first_plot, "final_s": final}


def test_live_decode_shows_its_first_plot_within_a_second_and_stays_in_step(lab, tmp_path):
    """Live visibility in seconds: a cold kernel's first live decode and a warm re-run each
    show their first plot within FIRST_PLOT_S of the decode starting (the widget's own
    clock) and long before the decode ends; at every frame the page painted, the step
    label, the plan plot's step and the highlighted token agree."""
    from playwright.sync_api import expect, sync_playwright

    console: list[str] = []
    measured = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = _open_notebook(browser, lab, {"width": 1366, "height": 768}, console, LIVE_SAMPLER)
            notebook = page.locator(".jp-NotebookPanel:visible")
            cells = notebook.locator(".jp-CodeCell")
            cells.nth(0).click()
            page.keyboard.press("Shift+Enter")  # imports, session
            expect(cells.nth(0).locator(".jp-InputArea-prompt")).to_have_text(re.compile(r"\[\d+\]"),
                                                                                timeout=90_000)
            live_cell = cells.nth(1)
            for run in ("cold", "warm"):
                page.evaluate("window.__wbSamples = []")
                live_cell.locator(".jp-InputArea-editor").click()
                page.keyboard.press("Control+Enter")
                expect(live_cell.locator(".wb-workbench .wb-step-label")).to_contain_text(FINAL, timeout=150_000)
                page.wait_for_timeout(1000)
                measured[run] = _live_timeline(page.evaluate("window.__wbSamples"))
                page.wait_for_timeout(1000)
        finally:
            browser.close()
    for run, m in measured.items():
        print(f"{run}: first step label {m['first_label_s']:.2f} s, first plot {m['first_plot_s']:.2f} s, "
              f"last step {m['final_s']:.2f} s after the decode started")
    keep = os.environ.get("WORKBENCH_BROWSER_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / "live_timeline.json").write_text(json.dumps(measured, indent=1))
    for run, m in measured.items():
        rows = m["rows"]
        assert m["first_plot_s"] is not None and m["final_s"] is not None, (run, rows)
        assert m["first_plot_s"] <= FIRST_PLOT_S, f"{run}: first plot {m['first_plot_s']:.2f} s into the decode: {rows}"
        assert m["first_plot_s"] <= m["first_label_s"] + 1.5, (run, rows)
        plotted = {r[3] for r in rows if r[0] < m["final_s"] and r[3] is not None}
        assert len(plotted) >= 3, f"{run}: the plot did not follow the steps while they ran: {rows}"
        # in step: from the first step shown on, every painted frame shows one step in all three
        shown = [r for r in rows if r[1] is not None or r[3] is not None]
        out_of_step = [r for r in shown if not (r[1] == r[3] and r[2] == r[4])]
        assert not out_of_step, f"{run}: label / plot / token disagree in {out_of_step} (all: {shown})"
    assert not console, "errors in the browser console:\n" + "\n".join(console)
