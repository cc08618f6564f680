/**
 * deploy/k8s/components/geo-policy-file (docs/deploy.md "The geo policy ConfigMap"), built onto
 * the production overlay with the real `kubectl kustomize` and validated with kubernetes-validate:
 * the ConfigMap keeps its name (a hashed one would roll the pods on every policy change), it is
 * mounted as a directory (the kubelet never updates a subPath mount) read-only into the authz
 * container only, GEO_POLICY_FILE names a key of it, the settings beside it start (no setting it
 * replaces is set), the policy in it is valid for the overlay's databases, and the pods' rollout
 * hash does not include it (a policy change is a live reload, not a rollout).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { relative, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeFileSync } from 'node:fs';
import { loadConfig } from '../../authz/src/common/config.ts';
import { parseContext, parsePolicy, policyRegionRule } from '../../authz/src/common/geo-policy-file.ts';
import { CONFIG_HASH_ANNOTATION } from '../k8s/render.ts';
import { tempDir } from '../../testkit/temp-dir.ts';
import { kubernetesValidate, kustomize, yamlDocs, type Resource } from './tools.ts';

const K8S = fileURLToPath(new URL('../k8s/', import.meta.url));

interface Pod {
  containers: { name: string; env?: { name: string; value?: string }[]; volumeMounts?: { name: string; mountPath: string; readOnly?: boolean; subPath?: string }[] }[];
  volumes: { name: string; configMap?: { name: string } }[];
}

function build(withComponent: boolean): { text: string; docs: Resource[] } {
  const dir = tempDir('edge-k8s-policy-');
  const rel = (p: string): string => relative(dir, join(K8S, p));
  writeFileSync(join(dir, 'kustomization.yaml'), [
    'apiVersion: kustomize.config.k8s.io/v1beta1', 'kind: Kustomization',
    `resources: [${rel('overlays/production')}]`,
    ...(withComponent ? [`components: [${rel('components/geo-policy-file')}]`] : []), '',
  ].join('\n'));
  const text = kustomize(dir);
  return { text, docs: yamlDocs(text) };
}

const find = (docs: Resource[], kind: string, name: string): Resource => {
  const r = docs.find((d) => d.kind === kind && (d['metadata'] as { name: string }).name === name);
  assert.ok(r !== undefined, `${kind}/${name}`);
  return r;
};

test('kubernetes geo-policy-file component – edge-geo-policy mounted as a directory into authz, GEO_POLICY_FILE resolves into it, the policy is valid there, no rollout on change', () => {
  const { text, docs } = build(true);
  const cm = find(docs, 'ConfigMap', 'edge-geo-policy');
  const data = cm['data'] as Record<string, string>;
  const deployment = find(docs, 'Deployment', 'edge');
  const spec = (deployment['spec'] as { template: { spec: Pod; metadata: { annotations: Record<string, string> } } }).template;
  const authz = spec.spec.containers.find((c) => c.name === 'authz')!;
  const path = authz.env?.find((e) => e.name === 'GEO_POLICY_FILE')?.value ?? '';
  const mount = authz.volumeMounts?.find((m) => path.startsWith(`${m.mountPath}/`));
  assert.ok(mount !== undefined, `${path} is under a mount of authz`);
  assert.deepEqual([mount.readOnly, mount.subPath], [true, undefined], 'read-only, the whole directory (a subPath mount is never updated)');
  const volume = spec.spec.volumes.find((v) => v.name === mount.name);
  assert.equal(volume?.configMap?.name, 'edge-geo-policy', 'the ConfigMap keeps its name: no hash suffix');
  const key = path.slice(mount.mountPath.length + 1);
  assert.ok(key in data, `${key} in edge-geo-policy`);
  // Envoy does not read the policy.
  assert.ok(!(spec.spec.containers.find((c) => c.name === 'envoy')?.volumeMounts ?? []).some((m) => m.name === mount.name));
  // The settings it joins start: none of those the file replaces is set.
  const settings = find(docs, 'ConfigMap', 'edge-settings')['data'] as Record<string, string>;
  const config = loadConfig({ ...settings, GEO_POLICY_FILE: path });
  const doc = parsePolicy(data[key]!, path, parseContext(config));
  // The overlay's GEOIP_DB is a country database: the shipped policy must name no region.
  assert.equal(policyRegionRule(doc), undefined);
  // A policy change is a live reload: the pods' rollout hash is the overlay's own.
  const plain = find(build(false).docs, 'Deployment', 'edge')['spec'] as { template: { metadata: { annotations: Record<string, string> } } };
  assert.equal(spec.metadata.annotations[CONFIG_HASH_ANNOTATION], plain.template.metadata.annotations[CONFIG_HASH_ANNOTATION]);
  for (const version of ['1.30.0', '1.37.0']) {
    const v = kubernetesValidate(text, version);
    assert.equal(v.status, 0, `${version}: ${v.stdout}${v.stderr}`);
  }
});
