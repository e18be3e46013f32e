// The bound on OpenAI API request bodies parsed at once
// (server/request_bytes_admission.h; review-deploy F2): the admission class
// by hand-counted bytes, then over HTTP against the in-process server (with
// a parse under way, a body that does not fit gets 503 with Retry-After, one
// that fits goes on; a stalled upload and small chunked bodies hold little
// or nothing; bytes come back however a request ends), and the flags.
#include "server/request_bytes_admission.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "server/openai_http_server.h"
#include "server/server_flags.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/openai_server.h"
#include "tests/server/test_util/scoped_flag.h"

namespace drt::server {
namespace {

using testing::ScopedFlag;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("RequestBytesAdmission admits bodies up to its capacity and refuses past it",
          "[server][openai]") {
  RequestBytesAdmission admission(100);
  std::optional<RequestBytesAdmission::Ticket> a = admission.TryAdmit(60);
  REQUIRE(a.has_value());
  CHECK(admission.admitted() == 60);
  std::optional<RequestBytesAdmission::Ticket> b = admission.TryAdmit(40);  // exactly full
  REQUIRE(b.has_value());
  CHECK(admission.admitted() == 100);
  CHECK_FALSE(admission.TryAdmit(1).has_value());
  CHECK(admission.refused_total() == 1);
  CHECK(admission.admitted() == 100);  // a refusal changes nothing

  a->Release();
  CHECK(admission.admitted() == 40);
  a->Release();  // twice: once only
  CHECK(admission.admitted() == 40);
  CHECK_FALSE(admission.TryAdmit(61).has_value());
  CHECK(admission.refused_total() == 2);
  {
    std::optional<RequestBytesAdmission::Ticket> c = admission.TryAdmit(60);
    REQUIRE(c.has_value());
    RequestBytesAdmission::Ticket moved = *std::move(c);
    c.reset();  // the moved-from ticket gives nothing back
    CHECK(admission.admitted() == 100);
  }
  CHECK(admission.admitted() == 40);  // the moved-to ticket gave its 60 back
  b.reset();
  CHECK(admission.admitted() == 0);

  // More than the capacity: only alone (drt-server's flags never ask this).
  std::optional<RequestBytesAdmission::Ticket> big = admission.TryAdmit(150);
  REQUIRE(big.has_value());
  CHECK_FALSE(admission.TryAdmit(1).has_value());
  big.reset();
  CHECK(admission.admitted() == 0);

  const std::string metrics = RenderRequestBytesMetrics(admission);
  CHECK(Contains(metrics, "\ndrt_openai_requests_overloaded_total 3\n"));
  CHECK(Contains(metrics, "\ndrt_openai_request_bytes_in_flight 0\n"));
  CHECK(Contains(metrics, "# TYPE drt_openai_requests_overloaded_total counter\n"));
}

TEST_CASE("ParseTickets ends this thread's admission only", "[server][openai]") {
  RequestBytesAdmission admission(100);
  ParseTickets tickets;
  tickets.Hold(*admission.TryAdmit(30));
  std::thread other([&] {
    tickets.Hold(*admission.TryAdmit(50));
    CHECK(admission.admitted() == 80);
    tickets.EndParse();
  });
  other.join();
  CHECK(admission.admitted() == 30);
  tickets.EndParse();
  CHECK(admission.admitted() == 0);
  tickets.EndParse();  // none held: nothing
  CHECK(admission.admitted() == 0);
}

TEST_CASE("ParseTickets::Scope ends this thread's parse however its scope is left",
          "[server][openai]") {
  RequestBytesAdmission admission(100);
  ParseTickets tickets;
  {
    const ParseTickets::Scope parsing(tickets);
    tickets.Hold(*admission.TryAdmit(40));
    CHECK(admission.admitted() == 40);
  }
  CHECK(admission.admitted() == 0);
  try {
    const ParseTickets::Scope parsing(tickets);
    tickets.Hold(*admission.TryAdmit(60));
    throw std::runtime_error("a handler that throws");
  } catch (const std::runtime_error&) {
  }
  CHECK(admission.admitted() == 0);
}

int Connect(int port) {
  const int sock = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(sock >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  timeval timeout{30, 0};
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return sock;
}

void SendAll(int sock, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(sock, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    REQUIRE(n > 0);
    sent += static_cast<size_t>(n);
  }
}

std::string Headers(size_t length) {
  return absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: ",
                      length, "\r\n\r\n");
}

// A whole request with a body of `length` bytes that is not valid JSON (a
// 400 once read and parsed), and the server's whole answer.
std::string Exchange(int port, size_t length) {
  const int sock = Connect(port);
  SendAll(sock, Headers(length) + std::string(length, '['));
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(sock, buffer, sizeof(buffer), 0)) > 0) {
    answer.append(buffer, static_cast<size_t>(n));
  }
  close(sock);
  return answer;
}

std::string StatusLine(const std::string& answer) { return answer.substr(0, answer.find("\r\n")); }

bool WaitForMetric(const OpenAiHttpServer& api, const std::string& line) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Contains(api.RenderMetrics(), "\n" + line + "\n")) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST_CASE("openai http: bodies past --openai_max_inflight_request_bytes get 503 with Retry-After",
          "[openai][server]") {
  OpenAiHttpOptions options;
  options.max_request_bytes = 64 << 10;
  options.max_inflight_request_bytes = 96 << 10;
  testing::OpenAiServer server(testing::SmallOptions(), options);
  OpenAiHttpServer& api = *server.api;

  // A parse of the largest size under way (admitted here by hand: a real
  // one takes a few milliseconds).
  std::optional<RequestBytesAdmission::Ticket> parsing =
      api.request_bytes_admission().TryAdmit(65536);
  REQUIRE(parsing.has_value());

  // 65536 + 40000 > 98304: refused once read, before it is parsed.
  const std::string refused = Exchange(api.port(), 40000);
  CHECK(StatusLine(refused) == "HTTP/1.1 503 Service Unavailable");
  CHECK(Contains(refused, "Retry-After: "));
  CHECK(Contains(refused, "this request's body (40000 bytes)"));
  CHECK(Contains(refused, "--openai_max_inflight_request_bytes"));
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_requests_overloaded_total 1\n"));
  // 65536 + 30000 fits: parsed (a 400: the body is no JSON).
  CHECK(StatusLine(Exchange(api.port(), 30000)) == "HTTP/1.1 400 Bad Request");
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_request_bytes_in_flight 65536\n"));

  // The parse ends: its bytes are given back, and 40000 fits.
  parsing->Release();
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_request_bytes_in_flight 0\n"));
  CHECK(StatusLine(Exchange(api.port(), 40000)) == "HTTP/1.1 400 Bad Request");

  // Over --openai_max_request_bytes: 413 naming the flag.
  const std::string too_big = Exchange(api.port(), 65537);
  CHECK(StatusLine(too_big) == "HTTP/1.1 413 Payload Too Large");
  CHECK(Contains(too_big, "65536 bytes, --openai_max_request_bytes"));
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_requests_overloaded_total 1\n"));
  api.Stop();
}

TEST_CASE("openai http: a stalled upload holds no admission and small chunked bodies count small",
          "[openai][server]") {
  OpenAiHttpOptions options;
  options.max_request_bytes = 64 << 10;
  options.max_inflight_request_bytes = 96 << 10;
  testing::OpenAiServer server(testing::SmallOptions(), options);
  OpenAiHttpServer& api = *server.api;

  // Two uploads of the largest size stalled after the headers (they were
  // admitted at their Content-Length, 131072 bytes > the bound): nothing
  // admitted, and a request that arrives whole is served.
  const int stalled_a = Connect(api.port());
  const int stalled_b = Connect(api.port());
  SendAll(stalled_a, Headers(65536) + std::string(1000, '['));
  SendAll(stalled_b, Headers(65536));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_request_bytes_in_flight 0\n"));
  CHECK(StatusLine(Exchange(api.port(), 40000)) == "HTTP/1.1 400 Bad Request");

  // Three small chunked bodies under way at once, each sent in two pieces
  // (they counted as 65536 bytes each, so the second got 503): all served.
  const std::string json = R"({"prompt":"hi","max_tokens":1,"x":1e999})";
  int chunked[3];
  for (int& sock : chunked) {
    sock = Connect(api.port());
    SendAll(sock, absl::StrCat("POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               "Content-Type: application/json\r\nTransfer-Encoding: chunked"
                               "\r\n\r\n", absl::Hex(10), "\r\n", json.substr(0, 10), "\r\n"));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int sock : chunked) {
    SendAll(sock, absl::StrCat(absl::Hex(json.size() - 10), "\r\n", json.substr(10),
                               "\r\n0\r\n\r\n"));
  }
  for (int sock : chunked) {
    std::string answer;
    char buffer[4096];
    ssize_t n;
    while ((n = recv(sock, buffer, sizeof(buffer), 0)) > 0) {
      answer.append(buffer, static_cast<size_t>(n));
    }
    close(sock);
    CHECK(StatusLine(answer) == "HTTP/1.1 400 Bad Request");  // parsed: the 1e999
    CHECK(Contains(answer, "1e999"));
  }
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_requests_overloaded_total 0\n"));
  close(stalled_a);
  close(stalled_b);
  api.Stop();
}

// A whole POST of `body` to `path`, and the server's whole answer.
std::string Post(int port, const std::string& path, const std::string& body) {
  const int sock = Connect(port);
  SendAll(sock, absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                             "Content-Type: application/json\r\nContent-Length: ",
                             body.size(), "\r\n\r\n", body));
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(sock, buffer, sizeof(buffer), 0)) > 0) {
    answer.append(buffer, static_cast<size_t>(n));
  }
  close(sock);
  return answer;
}

TEST_CASE("openai http: a number that overflows a double is 400 and gives its bytes back",
          "[openai][server]") {
  OpenAiHttpOptions options;
  options.max_request_bytes = 64 << 10;
  options.max_inflight_request_bytes = 96 << 10;
  testing::OpenAiServer server(testing::SmallOptions(), options);
  OpenAiHttpServer& api = *server.api;

  // nlohmann throws out_of_range (not parse_error) for 1e999. Bodies padded
  // to 60000 bytes: two of them (120000) do not fit the 98304 bound at once,
  // so a leaked admission would refuse every later one.
  for (const std::string path : {"/v1/completions", "/tokenize", "/v1/completions"}) {
    const std::string json = R"({"prompt":"hi","max_tokens":1,"x":1e999})";
    const std::string answer = Post(api.port(), path, json + std::string(60000 - json.size(), ' '));
    CHECK(StatusLine(answer) == "HTTP/1.1 400 Bad Request");
    CHECK(Contains(answer, "not valid JSON"));
    CHECK(Contains(answer, "1e999"));
    CHECK(WaitForMetric(api, "drt_openai_request_bytes_in_flight 0"));
  }
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_requests_overloaded_total 0\n"));
  api.Stop();
}

// The whole answer to `request`, sent as is.
std::string RawExchange(int port, const std::string& request) {
  const int sock = Connect(port);
  SendAll(sock, request);
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(sock, buffer, sizeof(buffer), 0)) > 0) {
    answer.append(buffer, static_cast<size_t>(n));
  }
  close(sock);
  return answer;
}

TEST_CASE("openai http: Content-Length with Transfer-Encoding is 400", "[openai][server]") {
  OpenAiHttpOptions options;
  testing::OpenAiServer server(testing::SmallOptions(), options);
  OpenAiHttpServer& api = *server.api;
  const std::string json = R"({"prompt":"hi","max_tokens":1})";
  // A chunked body that says Content-Length 0 (it was admitted as 0 bytes),
  // then a second request in the same bytes (the smuggling shape): one
  // answer, 400, and nothing of either body served.
  for (const std::string length : {"0", "5"}) {
    const std::string answer = RawExchange(
        api.port(),
        absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Type: application/json\r\nContent-Length: ", length, "\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n",
                     absl::Hex(json.size()), "\r\n", json, "\r\n0\r\n\r\n",
                     "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    CHECK(StatusLine(answer) == "HTTP/1.1 400 Bad Request");
    CHECK(Contains(answer, "both Content-Length and Transfer-Encoding"));
    CHECK(answer.find("HTTP/1.1", 1) == std::string::npos);  // the second request not served
  }
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_request_bytes_in_flight 0\n"));
  api.Stop();
}

TEST_CASE("drt-server flags openai_max_request_bytes and openai_max_inflight_request_bytes are checked",
          "[server][flags]") {
  ScopedFlag model("model", "/models/tiny");
  {
    auto config = ServerConfigFromFlags();
    REQUIRE(config.ok());
    CHECK(config->openai_max_request_bytes == 64 << 20);
    CHECK(config->openai_max_inflight_request_bytes == 128 << 20);
  }
  {
    ScopedFlag bytes("openai_max_request_bytes", "8388608");
    ScopedFlag inflight("openai_max_inflight_request_bytes", "16777216");
    auto config = ServerConfigFromFlags();
    REQUIRE(config.ok());
    CHECK(config->openai_max_request_bytes == 8 << 20);
    CHECK(config->openai_max_inflight_request_bytes == 16 << 20);
  }
  {
    ScopedFlag inflight("openai_max_inflight_request_bytes", "1000000");
    auto config = ServerConfigFromFlags();
    REQUIRE_FALSE(config.ok());
    CHECK(Contains(std::string(config.status().message()),
                   "--openai_max_inflight_request_bytes=1000000: must be at least "
                   "--openai_max_request_bytes (67108864)"));
  }
  {
    ScopedFlag bytes("openai_max_request_bytes", "100");
    auto config = ServerConfigFromFlags();
    REQUIRE_FALSE(config.ok());
    CHECK(Contains(std::string(config.status().message()),
                   "--openai_max_request_bytes=100: must be at least 1024"));
  }
}

}  // namespace
}  // namespace drt::server
