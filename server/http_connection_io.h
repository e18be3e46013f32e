// Socket-level pieces of the OpenAI HTTP API's server
// (server/openai_http_server.h): the stream one connection is served
// through, and a watch that tells when its client hangs up.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include <httplib.h>

#include "server/recv_buffer.h"

namespace drt::server {

// The socket of one connection: the request line and headers must have
// arrived by `header_deadline`, the whole request by `request_deadline`
// (both counted from the accept); each write waits at most the write
// timeout for room (the answer as a whole has no limit). A read past its
// deadline fails even when bytes are pending (a fast sender cannot outlive
// it). Once `stopping` is set reads end kStoppingReadWait after the first
// read that saw it, and a write waits at most
// kStoppingWriteWait (a write that can go at once still goes), so that
// stopping the server does not wait for slow or silent clients but the end
// of an answer still reaches a client that reads.
class ConnectionStream : public httplib::Stream {
 public:
  static constexpr std::chrono::milliseconds kStoppingWriteWait{1000};

  ConnectionStream(socket_t sock, std::chrono::steady_clock::time_point header_deadline,
                   std::chrono::steady_clock::time_point request_deadline,
                   std::chrono::milliseconds write_timeout, const std::atomic<bool>& stopping);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return sock_; }
  // Whether the request's headers have been read whole.
  bool headers_read() const { return headers_done_; }
  // Called once httplib has parsed the headers (the server's pre-routing
  // handler, on the thread that reads this stream): the body's deadline
  // applies from now on, whatever Track made of the bytes.
  void MarkHeadersRead() { headers_done_ = true; }
  // Whether the request time (the deadline of the body's reads) has passed:
  // a read that failed then timed out.
  bool request_time_passed() const {
    return std::chrono::steady_clock::now() >= request_deadline_;
  }
  // How long reads still wait once `stopping` is seen, counted once per
  // stream from the first read that sees it (not per read: a client that
  // keeps sending must not hold a stopping server).
  static constexpr std::chrono::milliseconds kStoppingReadWait{100};

 private:
  // Whether `events` became ready before `deadline` (or, once stopping,
  // before the shorter waits above).
  bool Wait(short events, std::chrono::steady_clock::time_point deadline) const;
  // The deadline of the next read: the header deadline until the empty
  // line (CRLF CRLF) that ends the headers has been read, then the
  // request's.
  std::chrono::steady_clock::time_point ReadDeadline() const;
  // Follows the bytes handed to httplib to see where the headers end.
  void Track(const char* data, size_t n);

  socket_t sock_;
  std::chrono::steady_clock::time_point header_deadline_;
  std::chrono::steady_clock::time_point request_deadline_;
  std::chrono::milliseconds write_timeout_;
  const std::atomic<bool>& stopping_;
  RecvBuffer recv_buffer_;
  bool headers_done_ = false;
  // When reads end because stopping was seen (unset until then); mutable:
  // Wait is const, as is_readable is.
  mutable std::optional<std::chrono::steady_clock::time_point> stop_reads_by_;
  size_t line_bytes_ = 0;   // bytes since the last '\n'
  bool line_is_cr_ = false;  // those bytes are one '\r'
  bool seen_line_ = false;   // a non-empty line (the request line) came
};

// Calls `on_disconnect` once when the client closes its end of `sock`
// (POLLRDHUP: it sent FIN, or the connection broke), from a thread of its
// own, until destroyed. The request has been read whole by then and the
// client sends nothing more, so a hang-up is the only event to wait for.
// (A client that half-closes after its request, shutdown(SHUT_WR), reads
// as gone too; the usual HTTP clients do not.)
class DisconnectWatch {
 public:
  DisconnectWatch(socket_t sock, std::function<void()> on_disconnect);
  ~DisconnectWatch();  // stops watching and joins the thread
  DisconnectWatch(const DisconnectWatch&) = delete;
  DisconnectWatch& operator=(const DisconnectWatch&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: started once stop_ exists
};

}  // namespace drt::server
