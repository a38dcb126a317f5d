#include "engine/generate/generator.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "engine/data/chat_format.h"
#include "engine/io/hf_model.h"
#include "engine/io/peft_adapter.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

// eos_token_id of generation_config.json (an id or a list), when the model has one.
StatusOr<std::vector<int32_t>> GenerationConfigEos(const std::string& model_dir) {
  const std::string file = (fs::path(model_dir) / "generation_config.json").string();
  if (!fs::exists(file)) return std::vector<int32_t>{};
  FT_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(file + ": not a JSON object");
  std::vector<int32_t> ids;
  const auto eos = j.find("eos_token_id");
  if (eos == j.end() || eos->is_null()) return ids;
  for (const auto& id : eos->is_array() ? *eos : nlohmann::json::array({*eos})) {
    if (!id.is_number_integer()) {
      return Status::InvalidArgument(file + ": eos_token_id must be a token id or a list of them");
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

// UTF-8 of U+FFFD, what a decode gives for an incomplete character.
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// How much of `text` is final: not an incomplete character at its end, and
// not a suffix that a stop string could still grow from.
size_t FinalLength(const std::string& text, const std::vector<std::string>& stop) {
  size_t safe = text.size();
  if (text.size() >= kReplacement.size() &&
      text.compare(text.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0) {
    safe -= kReplacement.size();
  }
  for (const std::string& s : stop) {
    for (size_t k = std::min(s.size() - 1, text.size()); k > 0; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        safe = std::min(safe, text.size() - k);
        break;
      }
    }
  }
  return safe;
}

// Where the first stop string starts in `text` (searching from `from`), or npos.
size_t FindStop(const std::string& text, const std::vector<std::string>& stop, size_t from) {
  size_t at = std::string::npos;
  for (const std::string& s : stop) {
    const size_t pos = text.find(s, from > s.size() ? from - s.size() : 0);
    if (pos != std::string::npos) at = std::min(at, pos);
  }
  return at;
}

}  // namespace

StatusOr<GenerationModel> LoadGenerationModel(const GenerationModelOptions& o) {
  FT_ASSIGN_OR_RETURN(ModelConfig config, ReadHfConfig(o.model_dir));
  if (Status takes = CheckHeadDimForDevice(o.device, config.head_dim); !takes.ok()) {
    return Status::InvalidArgument("--device " + std::string(EnumName(o.device)) + ": " + o.model_dir +
                                   " (config.json) has " + takes.message() + "; use --device cpu");
  }
  FT_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, CreateBackend(o.device));
  ModelOptions options;
  options.dtype = o.dtype;
  options.nf4 = o.nf4;
  options.nf4_config = {64, true, 256};  // QLoRA's: blocks of 64, double-quantized scales
  options.backend = std::move(backend);
  GenerationModel g;
  g.model = std::make_unique<Model>(config, options);
  FT_RETURN_IF_ERROR(LoadHfWeights(o.model_dir, g.model.get()));
  g.model->RoundWeightsToComputeDType();
  if (!o.adapter_dir.empty()) {
    FT_ASSIGN_OR_RETURN(LoraSpec spec, ReadPeftAdapterConfig(o.adapter_dir));
    FT_RETURN_IF_ERROR(g.model->EnableLora(spec).WithContext(o.adapter_dir));
    FT_RETURN_IF_ERROR(LoadPeftAdapter(o.adapter_dir, g.model.get()));
  }
  FT_ASSIGN_OR_RETURN(g.tokenizer, Tokenizer::Load(o.model_dir));
  FT_ASSIGN_OR_RETURN(g.eos_ids, GenerationConfigEos(o.model_dir));
  if (config.eos_token_id >= 0) g.eos_ids.push_back(static_cast<int32_t>(config.eos_token_id));
  if (auto id = g.tokenizer->TokenToId(g.tokenizer->eos_token()); id && !g.tokenizer->eos_token().empty()) {
    g.eos_ids.push_back(*id);
  }
  std::sort(g.eos_ids.begin(), g.eos_ids.end());
  g.eos_ids.erase(std::unique(g.eos_ids.begin(), g.eos_ids.end()), g.eos_ids.end());
  return g;
}

StatusOr<std::vector<int32_t>> PromptIds(const Tokenizer& tokenizer, const std::string& prompt,
                                         const PromptOptions& options) {
  if (!options.chat) return tokenizer.Encode(prompt, /*add_special_tokens=*/true);
  if (tokenizer.chat_template().empty()) {
    return Status::InvalidArgument(
        "--chat: the model's tokenizer_config.json has no chat_template; give the prompt as plain text "
        "(drop --chat)");
  }
  FT_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::Parse(tokenizer.chat_template()));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!options.system.empty()) messages.push_back({{"role", "system"}, {"content", options.system}});
  messages.push_back({{"role", "user"}, {"content", prompt}});
  ChatVars vars;
  vars.bos_token = tokenizer.bos_token();
  vars.eos_token = tokenizer.eos_token();
  vars.add_generation_prompt = true;
  vars.extra = ChatVarsFromStrings(options.chat_vars);
  FT_ASSIGN_OR_RETURN(std::string text, chat.Render(messages, vars));
  return tokenizer.Encode(text, /*add_special_tokens=*/false);
}

StatusOr<Generation> Generate(Model& model, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& eos_ids, const GenerateOptions& options,
                              const std::function<void(std::string_view)>& on_text) {
  if (prompt.empty()) return Status::InvalidArgument("the prompt has no tokens");
  if (options.max_new_tokens < 1) return Status::InvalidArgument("--max-new-tokens must be 1 or more");
  FT_RETURN_IF_ERROR(ValidateSampling(options.sampling));
  const int64_t positions = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  const int64_t limit = model.config().max_position_embeddings;
  if (positions > limit) {
    return Status::InvalidArgument("the prompt's " + std::to_string(prompt.size()) +
                                   " tokens and --max-new-tokens " + std::to_string(options.max_new_tokens) +
                                   " exceed the model's " + "max_position_embeddings " +
                                   std::to_string(limit));
  }
  std::vector<std::string> stop;
  for (const std::string& s : options.stop) {
    if (!s.empty()) stop.push_back(s);
  }
  KvCache cache(model, positions);
  Sampler sampler(options.sampling);
  FT_ASSIGN_OR_RETURN(std::vector<float> logits, model.Decode(prompt, &cache));
  Generation g;
  g.finish = "length";
  std::vector<int32_t> text_ids;  // the new tokens but an ending EOS
  size_t emitted = 0;
  auto emit = [&](size_t end) {
    if (end > emitted && on_text) on_text(std::string_view(g.text).substr(emitted, end - emitted));
    emitted = std::max(emitted, end);
  };
  while (static_cast<int64_t>(g.ids.size()) < options.max_new_tokens) {
    const int32_t next = sampler.Next(logits);
    g.ids.push_back(next);
    if (std::binary_search(eos_ids.begin(), eos_ids.end(), next)) {
      g.finish = "eos";
      break;
    }
    text_ids.push_back(next);
    g.text = tokenizer.Decode(text_ids, /*skip_special_tokens=*/true);
    if (const size_t at = FindStop(g.text, stop, emitted); at != std::string::npos) {
      g.text.resize(at);
      g.finish = "stop";
      break;
    }
    emit(FinalLength(g.text, stop));
    if (static_cast<int64_t>(g.ids.size()) == options.max_new_tokens) break;
    FT_ASSIGN_OR_RETURN(logits, model.Decode({next}, &cache));
  }
  emit(g.text.size());
  return g;
}

}  // namespace ft
