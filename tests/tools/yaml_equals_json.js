// Checks that a YAML document (sdctl -o yaml) parses, with js-yaml (installed with the
// OpenAPI validator in .npm-tools/), to the same value as a JSON document (sdctl -o json).
// Usage: node yaml_equals_json.js YAML_FILE JSON_FILE. Prints "same" and exits 0, or the
// difference and exits 1.
'use strict';
const fs = require('fs');
const yaml = require('js-yaml');
const y = yaml.load(fs.readFileSync(process.argv[2], 'utf8'), { schema: yaml.CORE_SCHEMA });
const j = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const canon = (v) => JSON.stringify(v, (k, x) => (x && typeof x === 'object' && !Array.isArray(x))
  ? Object.keys(x).sort().reduce((o, key) => { o[key] = x[key]; return o; }, {}) : x);
if (canon(y) === canon(j)) {
  console.log('same');
  process.exit(0);
}
console.log('YAML: ' + canon(y).slice(0, 2000));
console.log('JSON: ' + canon(j).slice(0, 2000));
process.exit(1);
