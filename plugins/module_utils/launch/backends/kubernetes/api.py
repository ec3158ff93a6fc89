# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubernetes backend's client of the API: the few reads and deletes the watch makes for a run (``Api``).

The ``kubernetes`` client is imported when one is made (a watch that follows pods): nothing else needs it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes.objects import LABEL, secret_name


class Api(object):
    """The few reads and deletes the watch makes, with the ``kubernetes`` client and the controller's kubeconfig
    (imported here, when a watch follows pods: nothing else needs the client)."""

    def __init__(self, kubeconfig=None, context=None, timeout=5):
        from kubernetes import client, config  # pylint: disable=import-outside-toplevel
        self.client = client
        self.api = config.new_client_from_config(config_file=kubeconfig, context=context)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.timeout = timeout

    @staticmethod
    def _json(resp):
        import json  # pylint: disable=import-outside-toplevel
        return json.loads(resp.data)

    def pods(self, namespace, name):
        return self._json(self.core.list_namespaced_pod(namespace, label_selector="%s=%s" % (LABEL, name),
                                                        _preload_content=False,
                                                        _request_timeout=self.timeout)).get("items") or []

    def nodes(self):
        return self._json(self.core.list_node(_preload_content=False, _request_timeout=self.timeout)).get("items") or []

    def service(self, namespace, name):
        """The run's Service (the owner of its pods and Secret), or None."""
        try:
            return self._json(self.core.read_namespaced_service(name, namespace, _preload_content=False,
                                                                _request_timeout=self.timeout))
        except self.client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def events(self, namespace, name):
        return self._json(self.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=%s" % name, _preload_content=False,
            _request_timeout=self.timeout)).get("items") or []

    def delete_run(self, namespace, name):
        """The run's Service (the garbage collector deletes what it owns), then its pods and Secret at once; the
        ones that were there."""
        deleted = []
        pods = [p["metadata"]["name"] for p in self.pods(namespace, name)]
        calls = [("Service", name, self.core.delete_namespaced_service)]
        calls += [("Pod", pod, self.core.delete_namespaced_pod) for pod in pods]
        calls.append(("Secret", secret_name(name), self.core.delete_namespaced_secret))
        for kind, target, call in calls:
            try:
                call(target, namespace, propagation_policy="Background", _preload_content=False,
                     _request_timeout=self.timeout)
                deleted.append("%s/%s" % (kind, target))
            except self.client.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise
        return deleted
