// Which local address a worker's servers listen on.
//
// In Kubernetes every pod has an IP of its own, so listening on 0.0.0.0 is
// harmless there; but when several pods share one host network (hostNetwork
// pods), two replicas can only both listen on port 2222 if each binds its own
// pod IP.
// Binding to the pod IP is equally correct in a real cluster: it is the
// address peers, Services and Prometheus reach the pod at.
//
// Pure functions; thread-safe.

#ifndef DISTRAIN_COMMON_NET_H_
#define DISTRAIN_COMMON_NET_H_

#include <optional>
#include <string>

namespace distrain {

// $POD_IP (the downward API's status.podIP, which the operator sets) when it is
// set and non-empty, else "0.0.0.0" (every interface).
std::string ListenHost();

// The same decision for a given value of $POD_IP (nullopt: unset), for tests.
std::string ListenHostFor(const std::optional<std::string>& pod_ip);

// host:port for a listener, bracketing an IPv6 host ("[fd00::5]:2222").
std::string JoinHostPort(const std::string& host, int port);

// "", 0.0.0.0, :: or [::]: a listener on every interface, not an address a
// peer can dial.
bool IsWildcardHost(const std::string& host);

// A host that a local client can connect to for a server listening on `host`:
// the wildcard addresses become 127.0.0.1, anything else is returned unchanged.
std::string ConnectHostFor(const std::string& host);

}  // namespace distrain

#endif  // DISTRAIN_COMMON_NET_H_
