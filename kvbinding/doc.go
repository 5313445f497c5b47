// Package kvbinding owns the state grouprouter shares through JetStream
// key-value buckets: the group bindings (group id -> node, with the ingress
// sequence each binding applies from), a watched in-memory cache of them, and
// the node registry (liveness, consumer presence, handler leases and routing
// checkpoints).
//
// Group ids are arbitrary UTF-8 of 1 to 1024 bytes; KV keys allow only
// [-/_=.a-zA-Z0-9]. Key maps a group id to a key injectively: ids made only
// of [-_=a-zA-Z0-9] are stored readable as "r.<id>", every other id as
// "b.<base64url(id)>". The binding value always carries the original id.
package kvbinding
