import * as pulumi from "@pulumi/pulumi";
import * as k8s from "@pulumi/kubernetes";

// The seed's provider set-up; a Deployment and its Service, named (Pulumi's auto-naming would
// add a random suffix that changes with every render).
const config = new pulumi.Config();
const provider = new k8s.Provider("yaml-provider", {
    renderYamlToDirectory: config.require("renderToDirectory"),
});
const labels = { "app.kubernetes.io/name": "web" };

new k8s.apps.v1.Deployment("web", {
    metadata: { name: "web", labels },
    spec: {
        replicas: 2,
        selector: { matchLabels: labels },
        template: {
            metadata: { labels },
            spec: { containers: [{ name: "web", image: "nginx:1.27-alpine", ports: [{ containerPort: 80 }] }] },
        },
    },
}, { provider });

new k8s.core.v1.Service("web", {
    metadata: { name: "web", labels },
    spec: { selector: labels, ports: [{ port: 80, targetPort: 80 }] },
}, { provider });
