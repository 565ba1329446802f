// A tiny shared library: the kind of helper every Jsonnet repository grows.
{
  labels(app):: { 'app.kubernetes.io/name': app, 'app.kubernetes.io/managed-by': 'argocd' },

  deployment(app, namespace, image, replicas):: {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name: app, namespace: namespace, labels: $.labels(app) },
    spec: {
      replicas: replicas,
      selector: { matchLabels: $.labels(app) },
      template: {
        metadata: { labels: $.labels(app) },
        spec: { containers: [{ name: app, image: image, ports: [{ containerPort: 8080 }] }] },
      },
    },
  },

  service(app, namespace):: {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: app, namespace: namespace, labels: $.labels(app) },
    spec: { selector: $.labels(app), ports: [{ port: 80, targetPort: 8080 }] },
  },
}
