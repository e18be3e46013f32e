// The reference prompt scores of the server tests: a scored gRPC Append
// (AppendRequest.prompt_logprobs) of `ids` into a new session, which is
// deleted after. Its scores are themselves checked against the engine in
// prompt_logprobs_service_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "drt/v1/drt.grpc.pb.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server::testing {

// The PromptLogprobs events in the order they came, `top` alternatives
// per token.
inline std::vector<drt::v1::PromptLogprobs> AppendScoreEvents(drt::v1::Drt::Stub& stub,
                                                               const std::vector<int32_t>& ids,
                                                               int32_t top) {
  const std::string id = NewSession(stub);
  grpc::ClientContext context;
  auto stream = stub.Append(&context);
  drt::v1::AppendRequest request;
  request.set_session_id(id);
  request.set_prompt_logprobs(top);
  *request.mutable_tokens()->mutable_ids() = {ids.begin(), ids.end()};
  stream->Write(request);
  stream->WritesDone();
  std::vector<drt::v1::PromptLogprobs> events;
  drt::v1::AppendResponse response;
  while (stream->Read(&response)) {
    if (response.has_prompt_logprobs()) events.push_back(response.prompt_logprobs());
  }
  REQUIRE(stream->Finish().ok());
  REQUIRE(DeleteSession(stub, id).ok());
  return events;
}

}  // namespace drt::server::testing
