// Validate the Prometheus Operator custom resources in a rendered manifest against the operator's
// own CRD schemas (npm @kubernetes-models/prometheus-operator). Usage: node validate_crds.mjs FILE
// Prints one line per resource; exits 1 when any is invalid or none was found.
import { readFileSync } from "node:fs";
import yaml from "js-yaml";
import { PrometheusRule, ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const kinds = { PrometheusRule, ServiceMonitor };
let bad = 0;
let seen = 0;
for (const doc of yaml.loadAll(readFileSync(process.argv[2], "utf8"))) {
  if (!doc || doc.apiVersion !== "monitoring.coreos.com/v1" || !kinds[doc.kind]) continue;
  seen++;
  try {
    new kinds[doc.kind](doc).validate();
    console.log(`ok ${doc.kind}/${doc.metadata.name}`);
  } catch (err) {
    bad++;
    console.log(`invalid ${doc.kind}/${doc.metadata?.name}: ${err.message}`);
  }
}
if (!seen) console.log("no ServiceMonitor or PrometheusRule found");
process.exit(bad || !seen ? 1 : 0);
