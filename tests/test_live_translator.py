"""The live translator of chapter 14, in the built book, opened from disk in Debian's Chromium with
every request outside the book's files refused.

* It translates the 1,000 sentences of test2016 as `translate` does (book/translator/reference.json,
  written with the model by tools/browser_model.py): greedy outputs identical for at least 99%,
  beam search within 0.3 sacreBLEU.
* Typed into the page, a sentence, an empty box, 400 words, emoji and a German sentence each get
  a translation or a clear message, and the page answers again afterwards.
* How fast it is: the model's load time and a 20-word sentence's time with beam 4.

With `ANNOTATED_TRANSLATOR_RESULTS=FOLDER`, the figures are written to FOLDER/browser.json with
their provenance (results/browser-translator/ holds the committed ones), and the speed goals are
checked: the model loads in at most 3 s and the 20-word sentence takes at most 300 ms. That run
is made on a quiet machine; inside `make test`, where other tests share the cores, the times are
only measured and printed, since a timed assertion there would fail with the machine's load
rather than with the code (speed goals live in measurements, not in timed tests).
"""

import json
import os
import statistics
import time
from pathlib import Path

import pytest
from test_browser import FLAGS, chromium, open_page

from annotated.bleu_scores import sacrebleu_score
from annotated.data.multi30k_corpus import load_multi30k

playwright = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "book" / "translator"
PAGE = "notebooks/14_attention_maps.html"
TWENTY_WORDS = (
    "A young woman in a long red dress and a black hat walks her small white dog along the street."
)
RESULTS: dict = {}


@pytest.fixture(scope="module")
def page(built_book):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=FLAGS)
        start = time.perf_counter()
        page, outside, errors = open_page(browser, (built_book / PAGE).as_uri(), (1280, 900))
        # nothing heavy is fetched until the box comes into view; then the page loads the model
        assert page.evaluate("typeof window.TRANSLATOR_MODEL") == "undefined"
        page.locator(".live-translator").scroll_into_view_if_needed()
        load_ms = page.evaluate("BookTranslator.load().then((m) => m.loadMs)")
        RESULTS["page"] = {"model_load_ms": load_ms,
                           "open_to_loaded_s": time.perf_counter() - start}  # fmt: skip
        yield page
        assert not outside, f"requests that left the machine: {outside}"
        assert not errors, errors
        browser.close()
    write_results()


def translate_in_page(page, sentences: list[str], beam: int) -> list[dict]:
    return page.evaluate(
        """async ([xs, beam]) => {
            const out = [];
            for (const x of xs) {
                const r = await BookTranslator.translate(x, beam);
                out.push({text: r.text, ms: r.ms});
            }
            return out;
        }""",
        [sentences, beam],
    )


def test_the_page_translates_test2016_as_translate_does(page):
    reference = json.loads((MODEL / "reference.json").read_text())
    pairs = load_multi30k("test_2016_flickr")
    assert reference["sources"] == [s for s, _ in pairs]  # the same sentences, in order
    references = [r for _, r in pairs]
    figures = {"sentences": len(pairs)}
    for beam in (1, 4):
        got = translate_in_page(page, reference["sources"], beam)
        mine, theirs = [g["text"] for g in got], reference[f"beam {beam}"]
        same = sum(a == b for a, b in zip(mine, theirs))
        bleu = sacrebleu_score(mine, references)[0], sacrebleu_score(theirs, references)[0]
        figures[f"beam {beam}"] = {
            "identical_to_translate": same,
            "sacrebleu_page": round(bleu[0], 2),
            "sacrebleu_translate": round(bleu[1], 2),
            "difference": round(bleu[0] - bleu[1], 2),
            "ms_per_sentence_median": statistics.median(g["ms"] for g in got),
            "differing": [{"source": s, "page": a, "translate": b}
                          for s, a, b in zip(reference["sources"], mine, theirs) if a != b][:20],
        }  # fmt: skip
        print(f"beam {beam}: {same} of {len(mine)} identical to translate's; sacreBLEU "
              f"{bleu[0]:.2f} in the page, {bleu[1]:.2f} by translate")  # fmt: skip
        if beam == 1:
            assert same >= 0.99 * len(mine)
        assert abs(bleu[0] - bleu[1]) < 0.3
    RESULTS["test2016"] = figures


def type_and_wait(page, text: str) -> dict:
    page.fill('[data-lt="input"]', text)
    page.click('[data-lt="go"]')
    page.wait_for_function(
        """() => !document.querySelector('[data-lt="go"]').disabled
            && document.querySelector('[data-lt="status"]').textContent !== 'translating…'""",
        timeout=60_000,
    )
    read = lambda name: page.inner_text(f'[data-lt="{name}"]')  # noqa: E731
    return {name: read(name) for name in ("status", "greedy", "beam")}


def test_typed_sentences_get_a_translation_or_a_clear_message(page):
    page.wait_for_function(  # the sentence already in the box, translated once it was in view
        "document.querySelector('[data-lt=\"beam\"]').textContent.length > 0", timeout=60_000
    )
    shown = type_and_wait(page, "Two dogs are playing in the snow.")
    assert shown["greedy"] and shown["beam"] and shown["status"].startswith("greedy")
    assert page.locator('[data-lt="chart"] svg, [data-lt="chart"] canvas').count() == 1
    assert type_and_wait(page, "   ")["status"] == "Type an English sentence first."
    assert type_and_wait(page, "A dog runs.")["beam"]  # a translation on screen, then an error:
    too_long = type_and_wait(page, " ".join(["dog"] * 400))
    assert too_long["status"].startswith("Could not translate:")
    assert "shorter sentences" in too_long["status"]
    assert too_long["greedy"] == too_long["beam"] == ""  # the last sentence's are gone
    assert page.locator('[data-lt="chart"] svg, [data-lt="chart"] canvas').count() == 0
    for text in ("A child 🙂 smiles at the 🐶 dog.", "Ein Mann fährt Fahrrad."):
        shown = type_and_wait(page, text)
        assert shown["status"].startswith("greedy") and shown["beam"], (text, shown)
    assert type_and_wait(page, "A man is riding a bike.")["beam"]  # still answering


def test_how_fast_the_page_translates(page):
    assert len(TWENTY_WORDS.split()) == 20
    runs = [translate_in_page(page, [TWENTY_WORDS], 4)[0]["ms"] for _ in range(7)]
    RESULTS["twenty_words_beam4_ms"] = {"median": statistics.median(runs), "runs": runs}
    print(f"load {RESULTS['page']['model_load_ms']:.0f} ms; 20 words, beam 4: "
          f"{statistics.median(runs):.0f} ms (median of 7)")  # fmt: skip
    assert all(ms > 0 for ms in runs)  # measured, by the page's own clock
    if os.environ.get("ANNOTATED_TRANSLATOR_RESULTS"):  # a recorded run: the goals
        assert RESULTS["page"]["model_load_ms"] <= 3000
        assert statistics.median(runs) <= 300


def write_results() -> None:
    folder = os.environ.get("ANNOTATED_TRANSLATOR_RESULTS")
    if not folder:
        return
    import torch

    from annotated.files import write_text_atomic
    from annotated.provenance import provenance

    command = "ANNOTATED_TRANSLATOR_RESULTS=" + folder + " pytest tests/test_live_translator.py"
    report = provenance(command, torch.device("cpu"))
    report["browser"] = "Debian's Chromium, headless, the page opened from disk (file://)"
    weight = {p.name: p.stat().st_size for p in MODEL.iterdir() if p.name != "reference.json"}
    vendored = ROOT / "book" / "vendor" / "translator"
    report["page_weight_bytes"] = {
        "model_files": weight,
        "scripts": {p.name: p.stat().st_size for p in sorted(vendored.iterdir())},
    }
    report.update(RESULTS)
    write_text_atomic(Path(folder) / "browser.json", json.dumps(report, indent=1) + "\n")
