// Renders display-math LaTeX strings the way readers of symattn's Markdown see them.
//
// Input (stdin): a JSON array of LaTeX strings, the bodies of $$ ... $$ blocks.
// Output (stdout): a JSON array, one object per string, with one result per renderer:
//   mathjax             MathJax 3 with the TeX packages of its standard tex-svg/tex-chtml
//                       components (base, ams, newcommand, configmacros; GitHub-like: \text
//                       prints its contents as they are), MathML output
//   mathjax_textmacros  the same with the textmacros package, which parses \text{...}
//                       as LaTeX text (Jupyter and many sites load it)
//   katex               KaTeX with throwOnError: true, MathML output
// and each result is {error: string|null, text: string}: the error message (MathJax's
// merror / data-mjx-error, a KaTeX ParseError) and the text the reader sees (the MathML's
// character data, without KaTeX's TeX annotation).
//
// MathJax is run without its noundefined and autoload packages, so that an undefined control
// sequence is an error here (on a page it prints the macro name in red, just as wrong) and
// symattn's math needs no extension that a page may not load.
//
// Used by tests/test_render_math.py; install the packages with `npm ci --prefix tests/node`
// (or elsewhere, naming that node_modules folder in SYMATTN_NODE_MODULES).

import {createRequire} from 'node:module';
import {dirname, join} from 'node:path';
import {fileURLToPath} from 'node:url';

// The packages come from SYMATTN_NODE_MODULES, else from node_modules beside this script.
const modules = process.env.SYMATTN_NODE_MODULES || join(dirname(fileURLToPath(import.meta.url)), 'node_modules');
const require = createRequire(join(modules, 'symattn.js'));
const {mathjax} = require('mathjax-full/js/mathjax.js');
const {TeX} = require('mathjax-full/js/input/tex.js');
const {liteAdaptor} = require('mathjax-full/js/adaptors/liteAdaptor.js');
const {RegisterHTMLHandler} = require('mathjax-full/js/handlers/html.js');
const {SerializedMmlVisitor} = require('mathjax-full/js/core/MmlTree/SerializedMmlVisitor.js');
const {STATE} = require('mathjax-full/js/core/MathItem.js');
require('mathjax-full/js/input/tex/base/BaseConfiguration.js');
require('mathjax-full/js/input/tex/ams/AmsConfiguration.js');
require('mathjax-full/js/input/tex/newcommand/NewcommandConfiguration.js');
require('mathjax-full/js/input/tex/configmacros/ConfigMacrosConfiguration.js');
require('mathjax-full/js/input/tex/textmacros/TextMacrosConfiguration.js');
const katex = require('katex');

const PACKAGES = ['base', 'ams', 'newcommand', 'configmacros'];

const adaptor = liteAdaptor();
RegisterHTMLHandler(adaptor);

function mathjaxRenderer(packages) {
  const doc = mathjax.document('', {InputJax: new TeX({packages})});
  const visitor = new SerializedMmlVisitor();
  return (tex) => {
    let mml;
    try {
      mml = visitor.visitTree(doc.convert(tex, {display: true, end: STATE.CONVERT}), doc);
    } catch (e) {
      return {error: String(e && e.message || e), text: ''};
    }
    let error = null;
    const merror = mml.match(/<merror[^>]*?data-mjx-error="([^"]*)"/) || mml.match(/<merror[^>]*>([\s\S]*?)<\/merror>/);
    if (merror) {
      error = decode(merror[1].replace(/<[^>]*>/g, ''));
    }
    return {error, text: textOf(mml)};
  };
}

function katexRenderer() {
  return (tex) => {
    let html;
    try {
      html = katex.renderToString(tex, {displayMode: true, throwOnError: true, output: 'mathml', strict: 'ignore'});
    } catch (e) {
      return {error: String(e && e.message || e), text: ''};
    }
    return {error: null, text: textOf(html.replace(/<annotation[\s\S]*?<\/annotation>/g, ''))};
  };
}

const ENTITIES = {amp: '&', lt: '<', gt: '>', quot: '"', apos: "'", nbsp: '\u00a0'};

function decode(text) {
  return text.replace(/&(#x[0-9a-fA-F]+|#[0-9]+|[a-zA-Z]+);/g, (whole, name) => {
    if (name[0] === '#') {
      return String.fromCodePoint(name[1] === 'x' ? parseInt(name.slice(2), 16) : parseInt(name.slice(1), 10));
    }
    return name in ENTITIES ? ENTITIES[name] : whole;
  });
}

// The character data of a MathML string, with the invisible operators (U+2061..U+2064) dropped.
function textOf(markup) {
  return decode(markup.replace(/>\s+</g, '><').replace(/<[^>]*>/g, '')).replace(/[\u2061-\u2064]/g, '');
}

const RENDERERS = {
  mathjax: mathjaxRenderer(PACKAGES),
  mathjax_textmacros: mathjaxRenderer([...PACKAGES, 'textmacros']),
  katex: katexRenderer(),
};

let input = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => { input += chunk; });
process.stdin.on('end', () => {
  const blocks = JSON.parse(input);
  const out = blocks.map((tex) => Object.fromEntries(
    Object.entries(RENDERERS).map(([name, render]) => [name, render(tex)])));
  process.stdout.write(JSON.stringify(out));
});
