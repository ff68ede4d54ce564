// Validates an OpenAPI 3 document with @apidevtools/swagger-parser (against the OpenAPI
// JSON schema, references resolved) and checks that every operation has an operationId,
// each used once. Prints "valid N paths" and exits 0, or the problems and exits 1.
// Usage: node openapi_validate.js FILE (NODE_PATH: where the module is installed).
'use strict';
const SwaggerParser = require('@apidevtools/swagger-parser');
const file = process.argv[2];
SwaggerParser.validate(file).then((api) => {
  const seen = new Map();
  const bad = [];
  for (const [path, item] of Object.entries(api.paths)) {
    for (const m of ['get', 'put', 'post', 'delete', 'patch', 'head', 'options']) {
      if (!item[m]) continue;
      const id = item[m].operationId;
      if (!id) bad.push(`${m.toUpperCase()} ${path}: no operationId`);
      else if (seen.has(id)) bad.push(`${m.toUpperCase()} ${path}: operationId ${id} also on ${seen.get(id)}`);
      else seen.set(id, `${m.toUpperCase()} ${path}`);
    }
  }
  if (bad.length) {
    console.error(bad.join('\n'));
    process.exit(1);
  }
  console.log(`valid ${Object.keys(api.paths).length} paths ${seen.size} operations`);
}).catch((e) => {
  console.error(String(e));
  process.exit(1);
});
