// The read side both HTTP servers' socket streams share (deadline_http_server.cc
// for the probes, http_connection_io.cc for the OpenAI API): httplib reads the
// request line and headers a byte at a time, so reads are served from a buffer
// filled one recv at a time.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <cstddef>

#include <httplib.h>

namespace drt::server {

class RecvBuffer {
 public:
  // Copies up to `size` buffered bytes to `ptr`. When none is buffered, first
  // asks `readable()` (false: -1, the stream's deadline or stop) and fills the
  // buffer with one recv, whose result is returned as is when it is <= 0.
  template <typename Readable>
  ssize_t Read(socket_t sock, char* ptr, size_t size, Readable readable) {
    if (begin_ == end_) {
      if (!readable()) return -1;
      const ssize_t n = recv(sock, buffer_, sizeof(buffer_), 0);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::copy(buffer_ + begin_, buffer_ + begin_ + n, ptr);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }

 private:
  char buffer_[4096];
  size_t begin_ = 0, end_ = 0;
};

}  // namespace drt::server
