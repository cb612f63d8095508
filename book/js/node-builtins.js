// Stands in for Node's `fs` and `module` when @sctg/sentencepiece-js is bundled for the browser:
// the package reaches for them only when it runs under Node, never in the page.
export default {};
export const readFileSync = undefined;
export const createRequire = undefined;
