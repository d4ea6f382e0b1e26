// Shared by the k6 scripts: customer questions like the demo model's training data.
export const QUESTIONS = [
  "Where is my order #48213? It was supposed to arrive yesterday.",
  "How do I return a pair of shoes that don't fit?",
  "Can I get a refund for a damaged blender?",
  "Do you have the blue rain jacket in size M?",
  "My payment failed but I was charged. What should I do?",
  "How long does standard shipping take?",
  "I can't log in to my account.",
  "Can I change the delivery address of my order?",
  "Hi! Thanks for the quick help last time.",
];

// Single-token words of the demo model's tokenizer (models/demo-chat/tokenizer.json), so a
// ~10 KB document is ~900 tokens and fits the demo model's 1024-token context.
const WORDS = ("accessories adjustable authorization breathable cancelling confirmation contacting " +
  "cushioning deliveries detachable difference dishwasher electronics everything frustrating " +
  "headphones inconvenience instalments insulation international internationally kitchenware " +
  "measurements minneapolis neighbours newsletter pittsburgh preferences processing protection " +
  "reflective replacement ridiculous sacramento smartwatch stationery streetwear sunglasses " +
  "sustainable understand verification vulcanized washington waterproof").split(" ");

export function documentOf(bytes) {
  const out = [];
  let len = 0;
  while (len < bytes) {
    const w = WORDS[Math.floor(Math.random() * WORDS.length)];
    out.push(w);
    len += w.length + 1;
  }
  return out.join(" ");
}
