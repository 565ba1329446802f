// Reads the ApplicationSet controller's request from stdin:
//   {"applicationSetName": "...", "input": {"parameters": {"tier": "prod"}}}
// and prints the parameters: one object per matching environment.
const fs = require('fs');

const request = JSON.parse(fs.readFileSync(0, 'utf8'));
const params = (request.input && request.input.parameters) || {};
const environments = JSON.parse(fs.readFileSync('environments.json', 'utf8'));

const out = environments
  .filter((e) => !params.tier || e.tier === params.tier)
  .map((e) => ({
    env: e.name,
    server: e.cluster,
    replicas: String(e.replicas),
    appset: request.applicationSetName,
  }));
process.stdout.write(JSON.stringify(out) + '\n');
