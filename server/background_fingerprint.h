// The model's fingerprint (engine/model_fingerprint.h) computed on a thread
// of its own right after load, for a server that serves SaveSession and
// LoadSession without --state_dir: otherwise the first of those calls reads
// the whole weights file inside the call (seconds for a checkpoint of many
// GB; docs/state_format.md, "Model fingerprint"). A call that needs the
// fingerprint while the thread still reads waits for that one read
// (ModelFingerprint's once-flag), never a second one.
//
// A cheaper fingerprint is not sound: what it protects is a state saved
// with one model and loaded into another, and two checkpoints of one shape
// may differ in any single value (a targeted edit, a fine-tune of one
// layer; tests/session_state_test.cc changes one float). Only every byte
// tells them apart, so the cost is moved off the calls, not cut.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "engine/model_fingerprint.h"

namespace drt::server {

class BackgroundFingerprint {
 public:
  // Starts computing `fingerprint` (nothing to do when it is null or known)
  // and logs its value, or the error every later state call will get, with
  // the time it took. When no thread can be started, logs that and leaves
  // the fingerprint to its first use (which then reads the file).
  explicit BackgroundFingerprint(std::shared_ptr<const ModelFingerprint> fingerprint);
  // Stops the read (between two of its pieces, at most 1 MiB apart) and
  // waits for the thread: a shutdown or a failed start-up does not wait for
  // a read of many GB. A stopped read records nothing (the fingerprint is
  // computed at its first use, if any).
  ~BackgroundFingerprint();
  BackgroundFingerprint(const BackgroundFingerprint&) = delete;
  BackgroundFingerprint& operator=(const BackgroundFingerprint&) = delete;

  // Waits until it is computed (for tests).
  void Wait();

 private:
  std::atomic<bool> cancel_{false};  // set by the destructor
  std::thread thread_;
};

}  // namespace drt::server
