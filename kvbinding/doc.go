// Package kvbinding owns the state grouprouter shares through JetStream
// key-value buckets: the group bindings (group id -> node, with the ingress
// sequence each binding applies from), a watched in-memory cache of them, and
// the node registry (liveness, consumer presence, handler leases and routing
// checkpoints).
//
// Group ids are arbitrary UTF-8 of 1 to 1024 bytes; KV keys allow only
// [-/_=.a-zA-Z0-9]. Key maps a group id to a key of at most MaxKeyLen (64)
// bytes: ids made only of [-_=a-zA-Z0-9] are stored readable as "r.<id>",
// other ids as "b.<base64url(id)>", when that fits; longer ids as
// "h.<base64url(SHA-256(id))>". The binding value always carries the
// original id, which is what names the group of a digest key; a record
// under a key that is not its group's is never taken for another group
// (ErrKeyCollision). Records of long ids written before digest keys stay
// under their full key (FullKey, LegacyKey, Store.UseLegacyKeys).
//
// The cache names groups by Ref: the id, or for a long id its digest key,
// so that it keeps no long id it does not need (a burst of 1,000-byte ids
// cost 3.5 times the memory of 64-byte ones when it did); Store.Names
// reads long ids back from their records.
package kvbinding
