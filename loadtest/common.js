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
