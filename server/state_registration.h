// A session's registration with the durable state store (server/state_store.h).
// StateStore::Register returns it, and every write of the session takes it:
// a write cannot name a session the store does not hold, so forgetting to
// register a durable session is impossible rather than silently
// non-durable. Copies share one registration; once the session is removed
// (StateStore::Remove), a write through any copy writes nothing.
#pragma once

#include <memory>
#include <string>

namespace drt::server {

class StateStore;
struct DurableRecord;  // the store's per-session record (server/state_store.cc)

class StateRegistration {
 public:
  // None: the session is not durable. A write through it is refused.
  StateRegistration() = default;

  bool registered() const { return record_ != nullptr; }
  const std::string& id() const { return id_; }

 private:
  friend class StateStore;
  StateRegistration(const StateStore* store, std::string id, std::shared_ptr<DurableRecord> record)
      : store_(store), id_(std::move(id)), record_(std::move(record)) {}

  const StateStore* store_ = nullptr;  // the store that issued it
  std::string id_;
  std::shared_ptr<DurableRecord> record_;
};

}  // namespace drt::server
