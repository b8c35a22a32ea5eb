// Validates Kubernetes objects against the OpenAPI schemas of the npm package
// kubernetes-models (the Kubernetes API) and the CRD schemas of
// @kubernetes-models/prometheus-operator, @kubernetes-models/cert-manager and
// @kubernetes-models/keda.
//
//   node validate.mjs NODE_MODULES_DIR < objects.json
//
// objects.json: a JSON array of objects (a rendered kustomization). Prints one line per
// object ("ok Kind/name" or "INVALID Kind/name: reasons") and exits 1 when any object is
// invalid or has a kind with no schema here (an unknown kind is an error, not a pass).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.argv[2];
if (!modules) {
  console.error("usage: node validate.mjs NODE_MODULES_DIR < objects.json");
  process.exit(2);
}

// apiVersion -> the package directory holding its models (group/version/Kind.js).
function modelPath(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group.endsWith("monitoring.coreos.com")) {
    return join(modules, "@kubernetes-models/prometheus-operator", group, version, `${kind}.js`);
  }
  if (group === "keda.sh") {
    return join(modules, "@kubernetes-models/keda", group, version, `${kind}.js`);
  }
  if (group.endsWith("cert-manager.io")) {
    return join(modules, "@kubernetes-models/cert-manager", group, version, `${kind}.js`);
  }
  return join(modules, "kubernetes-models", group || ".", version, `${kind}.js`);
}

const objects = JSON.parse(readFileSync(0, "utf8"));
let failures = 0;
for (const obj of objects) {
  const name = `${obj.kind}/${obj.metadata?.name ?? "?"}`;
  let Model;
  try {
    const mod = await import(pathToFileURL(modelPath(obj.apiVersion, obj.kind)).href);
    Model = mod[obj.kind];
  } catch (e) {
    console.log(`INVALID ${name}: no schema for ${obj.apiVersion} ${obj.kind} (${e.code ?? e.message})`);
    failures++;
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`ok ${name}`);
  } catch (e) {
    console.log(`INVALID ${name}: ${e.message}`);
    failures++;
  }
}
console.log(`${objects.length - failures} of ${objects.length} objects valid`);
process.exit(failures ? 1 : 0);
