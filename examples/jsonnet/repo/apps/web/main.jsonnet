local k = import 'k8s.libsonnet';
local app = std.extVar('app');
local namespace = std.extVar('namespace');
local replicas = std.parseInt(std.extVar('replicas'));

[
  k.deployment(app, namespace, 'registry.example.com/%s:2.1.0' % app, replicas),
  k.service(app, namespace),
]
