#include <array>
#include <sstream>

#include <fmt/ranges.h>

#include "qkv/tasks/builtin.hpp"

namespace qkv::tasks {

namespace {

// The dictionary: word i of the source translates as word i of the output. Nouns, then verbs,
// then adjectives.
constexpr std::size_t nouns = 8, verbs = 6, adjectives = 6, words = nouns + verbs + adjectives;
constexpr std::array<const char*, words> english = {"cat",   "dog",  "bird",  "fish",  "horse", "mouse", "lion",
                                                    "bear",  "sees", "chases", "eats", "likes", "bites", "helps",
                                                    "big",   "small", "red",  "black", "old",   "young"};
constexpr std::array<const char*, words> japanese = {"neko",  "inu", "tori",   "sakana", "uma",     "nezumi", "raion",
                                                     "kuma",  "miru", "ou",    "taberu", "konomu", "kamu",   "tasukeru",
                                                     "ookii", "chiisai", "akai", "kuroi", "furui", "wakai"};
constexpr std::int64_t source_pad = words, start = words, end = words + 1;

bool is_noun(std::int64_t t) { return t >= 0 && t < std::int64_t(nouns); }
bool is_verb(std::int64_t t) { return t >= std::int64_t(nouns) && t < std::int64_t(nouns + verbs); }
bool is_adjective(std::int64_t t) { return t >= std::int64_t(nouns + verbs) && t < std::int64_t(words); }

}  // namespace

TranslateTask::TranslateTask() {
  info_ = {.name = "translate",
           .description = "subject-verb-object sentences of 3-5 words into subject-object-verb ones, word by word",
           .vocab_size = words + 2, .n_classes = words + 2, .max_len = 6, .readout = nn::Readout::token, .causal = true,
           .pad = end,
           .seq2seq = Seq2SeqInfo{.source_vocab = words + 1, .max_source_len = 5, .source_pad = source_pad, .start = start, .end = end}};
}

Seq2SeqExample TranslateTask::draw(Generator& gen) const {
  std::vector<std::int64_t> source;
  const auto noun_phrase = [&] {
    if (gen.next_u64() % 2) source.push_back(std::int64_t(nouns + verbs + gen.next_u64() % adjectives));
    source.push_back(std::int64_t(gen.next_u64() % nouns));
  };
  noun_phrase();
  source.push_back(std::int64_t(nouns + gen.next_u64() % verbs));
  noun_phrase();
  return *example(source);
}

std::optional<Seq2SeqExample> TranslateTask::example(const std::vector<std::int64_t>& source) const {
  // [adjective] noun verb [adjective] noun → [adjective] noun [adjective] noun verb.
  std::size_t i = 0;
  std::vector<std::size_t> order;  // the source position of each output word
  const auto noun_phrase = [&] {
    if (i < source.size() && is_adjective(source[i])) order.push_back(i++);
    if (i >= source.size() || !is_noun(source[i])) return false;
    order.push_back(i++);
    return true;
  };
  if (!noun_phrase()) return std::nullopt;
  if (i >= source.size() || !is_verb(source[i])) return std::nullopt;
  const std::size_t verb = i++;
  if (!noun_phrase() || i != source.size()) return std::nullopt;
  order.push_back(verb);
  Seq2SeqExample e{.source = source, .output = {}, .alignment = {}};
  for (std::size_t p : order) {
    e.output.push_back(source[p]);  // the dictionary keeps each word's index
    e.alignment.push_back({p});
  }
  return e;
}

std::string TranslateTask::decode(const std::vector<std::int64_t>& tokens) const {
  std::string text;
  for (std::int64_t t : tokens) {
    if (t == end) break;
    if (t < 0 || t >= std::int64_t(words)) continue;
    if (!text.empty()) text += ' ';
    text += japanese[std::size_t(t)];
  }
  return text;
}

std::vector<std::int64_t> TranslateTask::encode(const std::string& text) const {
  std::vector<std::int64_t> tokens;
  std::istringstream in(text);
  for (std::string w; in >> w;) {
    const auto it = std::find(english.begin(), english.end(), w);
    if (it == english.end())
      fail("translate", "cannot read '{}' in \"{}\": the words are {}", w, text, fmt::join(english, " "));
    tokens.push_back(it - english.begin());
  }
  return tokens;
}

std::string TranslateTask::token_name(std::int64_t token) const {
  if (token == start) return "BOS";
  if (token == end) return "EOS";
  return token >= 0 && token < std::int64_t(words) ? japanese[std::size_t(token)] : std::to_string(token);
}

std::string TranslateTask::source_token_name(std::int64_t token) const {
  return token >= 0 && token < std::int64_t(words) ? english[std::size_t(token)] : "pad";
}

TaskSpec translate_task() {
  return seq2seq_spec("translate", [] { return std::make_unique<TranslateTask>(); }, 1, 1500);
}

}  // namespace qkv::tasks
