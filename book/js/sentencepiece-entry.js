// Bundled by tools/vendor_js.py (esbuild) into vendor/translator/sentencepiece.js: the
// SentencePiece processor of @sctg/sentencepiece-js as a plain script, window.SentencePiece.
export { SentencePieceProcessor } from "@sctg/sentencepiece-js";
