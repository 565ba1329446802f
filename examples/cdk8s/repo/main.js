// A cdk8s app in plain JavaScript: one chart with a Deployment, a Service and a
// PodDisruptionBudget, named after the Argo CD application.
const { App, Chart, ApiObject } = require('cdk8s');

const name = process.env.ARGOCD_APP_NAME;
const namespace = process.env.ARGOCD_APP_NAMESPACE;
const image = process.env.ARGOCD_ENV_IMAGE || 'registry.example.com/hello:latest';
if (!name || !namespace) {
  throw new Error('ARGOCD_APP_NAME and ARGOCD_APP_NAMESPACE must be set');
}

class WebService extends Chart {
  constructor(scope, id) {
    super(scope, id, { namespace, disableResourceNameHashes: true });
    const labels = { 'app.kubernetes.io/name': name };
    new ApiObject(this, 'deployment', {
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      metadata: { name, labels },
      spec: {
        replicas: 2,
        selector: { matchLabels: labels },
        template: {
          metadata: { labels },
          spec: {
            containers: [{ name: 'app', image, ports: [{ containerPort: 8080 }] }],
          },
        },
      },
    });
    new ApiObject(this, 'service', {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name, labels },
      spec: { selector: labels, ports: [{ port: 80, targetPort: 8080 }] },
    });
    new ApiObject(this, 'pdb', {
      apiVersion: 'policy/v1',
      kind: 'PodDisruptionBudget',
      metadata: { name, labels },
      spec: { minAvailable: 1, selector: { matchLabels: labels } },
    });
  }
}

const app = new App();
new WebService(app, name);
process.stdout.write(app.synthYaml());
