/* The live translator of chapter 14.
 *
 * The CPU profile's model, exported to ONNX (appendix A5) by tools/browser_model.py, runs in the
 * page on ONNX Runtime Web. The search is chapter 7's beam search (annotated/decoding.py:
 * beam_search_core, _extend, _final_beams) written again for one sentence, step for step and in
 * the same 32-bit arithmetic, so that the page translates as `translate` does;
 * tests/test_live_translator.py compares the two on test2016. Greedy search is beam size 1.
 * Everything arrives through <script> tags (tools/vendor_js.py), so it works from file://.
 */
(function () {
  "use strict";
  const BOS = 1, EOS = 2;
  const f32 = Math.fround;

  function bytes(base64) {
    const text = atob(base64);
    const out = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) out[i] = text.charCodeAt(i);
    return out;
  }

  // The heavy scripts (31 MB, most of it ONNX Runtime's WebAssembly and the model as base64) load
  // only when the translator is first needed: a reader who never scrolls to it never fetches them.
  const HERE = document.currentScript.src.replace(/[^/]*$/, "translator/");
  const HEAVY = ["ort.wasm.min.js", "ort-runtime.js", "sentencepiece.js", "model.js"];

  function script(name) {
    return new Promise((resolve, reject) => {
      const tag = document.createElement("script");
      tag.src = HERE + name;
      tag.onload = resolve;
      tag.onerror = () => reject(new Error(`could not load ${name} from the book's files`));
      document.head.appendChild(tag);
    });
  }

  let loading = null;
  function load() { // the model, once: {encoder, decoder, sp, config, pieces, about, loadMs}
    loading = loading || (async () => {
      const start = performance.now();
      for (const name of HEAVY) await script(name);
      const m = window.TRANSLATOR_MODEL;
      ort.env.wasm.numThreads = 1; // a page opened as a file cannot share memory with workers
      ort.env.wasm.wasmBinary = bytes(window.ORT_WASM);
      const loader = new Blob([window.ORT_LOADER], { type: "text/javascript" });
      ort.env.wasm.wasmPaths = { mjs: URL.createObjectURL(loader) };
      const session = (name) => ort.InferenceSession.create(bytes(m.files[name]), {
        executionProviders: ["wasm"],
        externalData: [{ path: "weights.bin", data: bytes(m.files["weights.bin"]) }],
      });
      const encoder = await session("encoder.onnx"), decoder = await session("decoder_step.onnx");
      const sp = new SentencePiece.SentencePieceProcessor();
      await sp.loadFromB64StringModel(m.files["sentencepiece.model"]);
      return { encoder, decoder, sp, config: m.config, pieces: m.pieces, about: m.about,
               loadMs: performance.now() - start };
    })();
    return loading;
  }

  function pickRows(tensor, rows) { // row r of the result is row rows[r] of `tensor`
    const [, ...rest] = tensor.dims, size = rest.reduce((a, b) => a * b, 1);
    const out = new tensor.data.constructor(rows.length * size);
    rows.forEach((r, i) => out.set(tensor.data.subarray(r * size, (r + 1) * size), i * size));
    return new ort.Tensor(tensor.type, out, [rows.length, ...rest]);
  }

  function lengthPenalty(length, alpha) { // ((5 + |Y|) / 6)^alpha in float32, as torch computes it
    return f32(Math.pow(f32((5 + length) / 6), f32(alpha)));
  }

  function best(row, k) { // the k largest entries of `row`: [[index, value], ...], largest first
    const top = [];
    for (let i = 0; i < row.length; i++) {
      if (top.length < k || row[i] > top[top.length - 1][1]) {
        let j = Math.min(top.length, k - 1);
        while (j > 0 && top[j - 1][1] < row[i]) j--;
        top.splice(j, 0, [i, row[i]]);
        if (top.length > k) top.pop();
      }
    }
    return top;
  }

  class Step { // chapter 7's StepDecoder for K rows of one sentence, on the ONNX graph
    constructor(model, memory, src, K) {
      const c = model.config, rows = new Array(K).fill(0);
      this.model = model;
      this.memory = pickRows(memory, rows);
      this.src = pickRows(src, rows);
      this.names = [];
      for (let i = 0; i < c.layers; i++) this.names.push("k" + i, "v" + i);
      const empty = new ort.Tensor("float32", new Float32Array(0), [K, c.heads, 0, c.d_k]);
      this.past = this.names.map(() => empty);
      this.t = 0;
    }
    async step(tokens) { // -> log-probabilities (K, V) and where each head looked (K, L*H*n)
      const feeds = {
        token: new ort.Tensor("int64", BigInt64Array.from(tokens, BigInt), [tokens.length, 1]),
        t: new ort.Tensor("int64", BigInt64Array.of(BigInt(this.t)), [1]),
        memory: this.memory, src: this.src,
      };
      this.names.forEach((n, i) => { feeds["past_" + n] = this.past[i]; });
      const out = await this.model.decoder.run(feeds);
      this.past = this.names.map((n) => out[n]);
      this.t += 1;
      return { logProbs: out.log_probs.data, looked: out.cross_attention.data };
    }
    reorder(rows) { this.past = this.past.map((p) => pickRows(p, rows)); }
  }

  // One sentence's beam search: beam_search_core with B = 1. Returns the best hypothesis with
  // the attention of each generated token.
  async function search(model, src, K, alpha) {
    const n = src.length, limit = n + 50, V = model.pieces.length;
    const srcT = new ort.Tensor("int64", BigInt64Array.from(src, BigInt), [1, n]);
    const memory = (await model.encoder.run({ src: srcT })).memory;
    const decoder = new Step(model, memory, srcT, K);
    let ys = Array.from({ length: K }, () => [BOS]);
    let logProb = Array.from({ length: K }, (_, k) => (k === 0 ? 0 : -Infinity));
    let length = new Array(K).fill(0);
    let finished = Array.from({ length: K }, (_, k) => k > 0);
    let looked = Array.from({ length: K }, () => []);
    const kk = Math.min(K, V);
    while (!finished.every(Boolean)) {
      const out = await decoder.step(ys.map((y) => y[y.length - 1]));
      const A = out.looked.length / K, cands = [];
      for (let k = 0; k < K; k++) { // _extend: each hypothesis's K best tokens, then the K best
        const top = finished[k]
          ? Array.from({ length: kk }, (_, j) => [EOS, j === 0 ? 0 : -Infinity])
          : best(out.logProbs.subarray(k * V, (k + 1) * V), kk);
        const penalty = lengthPenalty(length[k] + (finished[k] ? 0 : 1), alpha);
        top.forEach(([token, lp], j) => {
          const candLp = f32(logProb[k] + lp);
          cands.push({ parent: k, token, logProb: candLp, score: f32(candLp / penalty),
                       index: k * kk + j });
        });
      }
      cands.sort((a, b) => b.score - a.score || a.index - b.index);
      const chosen = cands.slice(0, K), parent = chosen.map((c) => c.parent);
      const grown = chosen.map((c) => length[c.parent] + (finished[c.parent] ? 0 : 1));
      looked = chosen.map((c) => (finished[c.parent] ? looked[c.parent]
        : looked[c.parent].concat([out.looked.slice(c.parent * A, (c.parent + 1) * A)])));
      finished = chosen.map((c, i) => finished[c.parent] || c.token === EOS
        || grown[i] >= limit || c.logProb === -Infinity);
      ys = chosen.map((c) => ys[c.parent].concat([c.token]));
      logProb = chosen.map((c) => c.logProb);
      length = grown;
      decoder.reorder(parent);
    }
    const ranked = [...Array(K).keys()].filter((k) => logProb[k] !== -Infinity).map((k) => ({
      k, score: f32(logProb[k] / lengthPenalty(length[k], alpha)),
    })).sort((a, b) => b.score - a.score || a.k - b.k);
    const k = ranked[0].k, tokens = ys[k].slice(1, 1 + length[k]);
    return { tokens, looked: looked[k], score: ranked[0].score };
  }

  async function translate(text, K = 4, alpha = 0.6) {
    const model = await load();
    if (!text.trim()) return { text: "", ids: [], pieces: [], looked: [], ms: 0 };
    const start = performance.now();
    const ids = model.sp.encodeIds(text).concat([EOS]);
    const most = model.config.max_len - 51; // room for the source and 50 more tokens
    if (ids.length > most) {
      throw new Error(`this sentence has ${ids.length} pieces with </s>; the model reads at ` +
                      `most ${most}. Split it into shorter sentences.`);
    }
    const found = await search(model, ids, K, alpha);
    const words = found.tokens.filter((t) => t > EOS);
    return { text: model.sp.decodeIds(Int32Array.from(words)), ids, tokens: found.tokens,
             looked: found.looked, ms: performance.now() - start };
  }

  function distinct(tokens) { // axis labels, as annotated/experiments/attention_maps.py makes them
    const seen = {};
    return tokens.map((t) => { seen[t] = (seen[t] || 0) + 1; return seen[t] === 1 ? t : `${t}·${seen[t]}`; });
  }

  function mapRows(model, result) { // the rows attention_chart draws, from one translation
    const c = model.config, n = result.ids.length;
    const keys = distinct(result.ids.slice(0, -1).map((i) => model.pieces[i]).concat(["</s>"]));
    const inputs = [BOS].concat(result.tokens).slice(0, result.looked.length);
    const queries = distinct(inputs.map((i) => (i === BOS ? "<s>" : model.pieces[i])));
    const rows = [], positions = keys.map((_, i) => i);
    for (let layer = 0; layer < c.layers; layer++) {
      for (let head = 0; head < c.heads; head++) {
        queries.forEach((query, i) => {
          const at = (layer * c.heads + head) * n, w = result.looked[i].slice(at, at + n);
          rows.push({ attention: "encoder-decoder attention", layer, head, query,
                      "query position": i, key: keys, "key position": positions,
                      weight: Array.from(w, (x) => Math.round(x * 1000) / 1000) });
        });
      }
    }
    return rows;
  }

  function widget(box) { // the page's text box, outputs, heat map and timings
    const $ = (name) => box.querySelector(`[data-lt="${name}"]`);
    const spec = JSON.parse($("spec").textContent), status = $("status");
    const run = async () => {
      if ($("go").disabled) return; // one translation at a time: Enter pressed again waits
      $("go").disabled = true;
      status.textContent = "translating…";
      try {
        const model = await load();
        const greedy = await translate($("input").value, 1);
        const beam = await translate($("input").value, 4);
        $("greedy").textContent = greedy.text;
        $("beam").textContent = beam.text;
        if (!beam.ids.length) {
          status.textContent = "Type an English sentence first.";
        } else {
          status.textContent = `greedy ${greedy.ms.toFixed(0)} ms, beam search ` +
            `${beam.ms.toFixed(0)} ms (model loaded in ${model.loadMs.toFixed(0)} ms)`;
          spec.datasets[spec.data.name] = mapRows(model, beam);
          await vegaEmbed($("chart"), spec, { actions: false });
        }
      } catch (e) { // no translation on screen that is not of the sentence in the box
        $("greedy").textContent = "";
        $("beam").textContent = "";
        $("chart").replaceChildren();
        status.textContent = `Could not translate: ${e.message}`;
      } finally {
        $("go").disabled = false;
      }
    };
    $("go").addEventListener("click", run);
    $("input").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); run(); } });
    const start = () => {
      status.textContent = "loading the model…";
      load().then((m) => { status.textContent = `model loaded in ${m.loadMs.toFixed(0)} ms`; run(); },
                   (e) => { status.textContent = `The model could not be loaded: ${e.message}`; });
    };
    const seen = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) { seen.disconnect(); start(); }
    });
    seen.observe(box);
  }

  window.BookTranslator = { load, translate };
  const start = () => document.querySelectorAll(".live-translator").forEach(widget);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
