// Structured output: a JSON schema (OpenAI's response_format json_schema) or "any JSON object"
// (json_object) compiled into a byte grammar (engine/grammar.hpp), so that the sampled text
// always parses and validates.
//
// Supported: type (one or a list; object, array, string, number, integer, boolean, null),
// properties / required / additionalProperties (properties come in the schema's order, which
// the caller keeps by parsing it as an ordered_json; a required one always, an optional one may
// be left out; with no properties, additionalProperties
// gives the values of free keys), items / minItems / maxItems, minLength / maxLength, enum,
// const, anyOf, allOf of one schema, $ref into #/$defs or #/definitions (recursion included),
// and the annotations (title, description, default, examples, $schema, $id, $comment, ...).
// Anything else (pattern, format, minimum, oneOf, not, uniqueItems, ...) is refused with its
// name and place, never ignored: the output could break it.
//
// The text is compact JSON with optional whitespace between tokens (at most 20 bytes in a row,
// so a model cannot stall in it), strings of valid UTF-8 with JSON's escapes, numbers of at most
// 16 integer and 16 fraction digits.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/grammar.hpp"

namespace ember::server {

// The grammar of JSON that validates against `schema`. Throws SchemaError naming an unsupported
// keyword or a malformed schema, with its JSON pointer.
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema);
// The grammar of any JSON object (response_format json_object).
std::shared_ptr<const Grammar> json_object_grammar();

// One grammar of several schemas' JSON values and literal text between them (tool calls: each
// function's arguments inside the model's call syntax). value() compiles a schema into a rule
// (throws SchemaError as json_schema_grammar does), grammar() adds the rest, finish() fixes the
// root.
class SchemaGrammarBuilder {
 public:
  SchemaGrammarBuilder();
  ~SchemaGrammarBuilder();
  int value(const nlohmann::ordered_json& schema);
  Grammar& grammar();
  std::shared_ptr<const Grammar> finish(int root);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::unique_ptr<const nlohmann::ordered_json>> schemas_;  // the $refs point into them
};

struct SchemaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace ember::server
