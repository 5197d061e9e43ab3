// OpenAI's Responses API (POST /v1/responses), stateless, as plain data over the chat machinery:
// a request becomes the chat completions request it means (parse_completion_request), and the
// answer comes back as a response object or its stream of events.
//   input          a string (one user message) or items: messages (role system / developer /
//                  user / assistant; content a string or input_text / output_text parts),
//                  function_call items (an assistant's calls) and function_call_output items
//                  (their results)
//   instructions   a system message before the input
//   max_output_tokens, temperature, top_p, tools (function tools, flat: {type, name, description,
//   parameters, strict}), tool_choice, parallel_tool_calls, text.format (text, json_object,
//   json_schema {name, schema, strict}), stream, store, metadata, user, include (empty),
//   truncation ("disabled")
// Responses are not stored (the object says "store": false): previous_response_id is a 400 and
// nothing can be fetched back (404). Every other field is a 400 naming it.
#pragma once
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/api.hpp"

namespace ember::server::responses {

struct Request {
  CompletionRequest chat;  // the chat request it means (stream as asked)
  json tools;              // the request's tools and tool_choice, echoed in the response object
  json tool_choice;
  json text_format = {{"type", "text"}};  // text.format as asked
  std::string instructions;
};
std::variant<Request, ApiError> parse_request(std::string_view body, const ServedModel& model);

struct Meta {
  std::string id;  // resp_...
  int64_t created = 0;
  std::string model;
};

// The output items: the text as a message (when there is text or no call) and each call as a
// function_call item (arguments a JSON string), ids derived from the response's.
json output_items(const Meta& m, const std::string& text, const std::vector<ToolCall>& calls);
// The response object; status "completed", or "incomplete" with incomplete_details when the token
// limit cut it.
json response_json(const Meta& m, const Request& r, const json& output, FinishReason finish, const Usage& u);
// One server-sent event: "event: <type>\ndata: <json with type and sequence_number>\n\n".
std::string event(const std::string& type, json data, int64_t& sequence);

}  // namespace ember::server::responses
