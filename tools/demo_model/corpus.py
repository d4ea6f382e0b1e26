"""Seeded generator of synthetic e-commerce customer-service conversations.

Every conversation is built from a per-conversation "world" (store, policies, customer, orders,
products, today's date) so that the assistant's answers stay consistent with the slots it was
given: the order number the user typed, the return window stated in the system prompt, the
colours a product comes in. Phrasing comes from paraphrase pools; entities are combinatorial.

The output is a list of records, either {"messages": [{"role", "content"}, ...]} for chats or
{"text": ...} for short help-centre articles (so raw, template-less prompts also make sense).
The same seed always yields the same records (only `random.Random` is used, no set iteration).
"""

import datetime as dt
import random

# The chat template inserts this system prompt when a conversation has none, so a bare
# question gets the same behaviour as the ~15% of training chats that use it verbatim.
DEFAULT_STORE = ("Brook Market", "clothing, shoes, electronics and home goods")
DEFAULT_SYSTEM = ("You are a helpful customer-service assistant for Brook Market, an online "
                  "store selling clothing, shoes, electronics and home goods.")

# ---------------------------------------------------------------- entity pools

STORES = [
    ("Northwind Outfitters", "outdoor clothing and gear"),
    ("Bluebird Home", "home goods and kitchenware"),
    ("Pixel Harbor", "electronics and accessories"),
    ("Maple & Moss", "clothing, shoes and accessories"),
    ("Cobalt Street", "streetwear and sneakers"),
    ("Little Lantern", "home decor and lighting"),
    ("Summit Supply Co.", "hiking and camping equipment"),
    ("Urban Thread", "everyday clothing"),
    ("Brightside Market", "home, kitchen and electronics"),
    ("Fernway", "sustainable clothing and bags"),
    ("Kestrel Sports", "running and fitness gear"),
    ("Tidewater Goods", "bags, bottles and travel gear"),
    ("Quill & Oak", "stationery, desk lamps and home office"),
    ("Sunny Aisle", "everything for the home"),
]

AGENT_NAMES = ["Ava", "Sam", "Maya", "Leo", "Nora", "Theo", "Iris", "Max", "Zoe", "Eli", "Ruby",
               "Finn", "Mila", "Jonah", "Lena", "Omar"]

FIRST_NAMES = ["Emma", "Liam", "Olivia", "Noah", "Sophia", "James", "Isabella", "Lucas", "Mia",
               "Ethan", "Amelia", "Mason", "Harper", "Logan", "Ella", "Aiden", "Chloe", "Daniel",
               "Grace", "Henry", "Aria", "Jack", "Lily", "Owen", "Hannah", "Samuel", "Zara",
               "David", "Priya", "Mateo", "Yuki", "Fatima", "Carlos", "Ana", "Wei", "Sara",
               "Kofi", "Ingrid", "Raj", "Elena", "Tom", "Nina", "Marcus", "Julia", "Ahmed",
               "Chen", "Laura", "Pedro", "Hugo", "Anika"]
LAST_NAMES = ["Smith", "Johnson", "Garcia", "Brown", "Miller", "Davis", "Martinez", "Lopez",
              "Wilson", "Anderson", "Taylor", "Thomas", "Moore", "Jackson", "Martin", "Lee",
              "Walker", "Hall", "Young", "King", "Wright", "Scott", "Green", "Baker", "Adams",
              "Nguyen", "Patel", "Kim", "Chen", "Rossi", "Schmidt", "Silva", "Cohen", "Novak",
              "Okafor", "Larsen", "Dubois", "Tanaka", "Murphy", "Reyes"]
EMAIL_DOMAINS = ["gmail.com", "outlook.com", "yahoo.com", "icloud.com", "proton.me", "mail.com"]

STREETS = ["Oak", "Maple", "Cedar", "Pine", "Elm", "Lake", "Hill", "Park", "River", "Sunset",
           "Highland", "Washington", "Lincoln", "Church", "Mill", "Spring", "Willow", "Chestnut",
           "Forest", "Meadow", "Harbor", "Bay", "Ridge", "Valley"]
STREET_TYPES = ["Street", "Avenue", "Road", "Lane", "Drive", "Court", "Boulevard", "Way", "Place"]
CITIES = [("Portland", "OR", "97"), ("Austin", "TX", "78"), ("Denver", "CO", "80"),
          ("Seattle", "WA", "98"), ("Boston", "MA", "02"), ("Chicago", "IL", "60"),
          ("Atlanta", "GA", "30"), ("Phoenix", "AZ", "85"), ("Madison", "WI", "53"),
          ("Raleigh", "NC", "27"), ("Tampa", "FL", "33"), ("Columbus", "OH", "43"),
          ("San Diego", "CA", "92"), ("Nashville", "TN", "37"), ("Salt Lake City", "UT", "84"),
          ("Minneapolis", "MN", "55"), ("Richmond", "VA", "23"), ("Boise", "ID", "83"),
          ("Albany", "NY", "12"), ("Omaha", "NE", "68"), ("Tucson", "AZ", "85"),
          ("Pittsburgh", "PA", "15"), ("Sacramento", "CA", "95"), ("Kansas City", "MO", "64")]

CARRIERS = ["UPS", "FedEx", "USPS", "DHL"]

MODEL_NAMES = ["Aurora", "Summit", "Breeze", "Nimbus", "Harbor", "Cascade", "Ember", "Willow",
               "Atlas", "Juniper", "Orbit", "Pioneer", "Drift", "Solstice", "Terra", "Meridian",
               "Nova", "Canyon", "Echo", "Maple", "Ridge", "Coastal", "Alpine", "Luna", "Vista",
               "Granite", "Sierra", "Zephyr", "Aspen", "Comet"]

COLOURS = ["black", "white", "navy", "grey", "olive", "red", "sand", "forest green", "burgundy",
           "sky blue", "charcoal", "cream", "mustard", "teal", "pink", "brown", "lavender",
           "rust orange", "silver", "coral"]

APPAREL_SIZES = ["XS", "S", "M", "L", "XL", "XXL"]
SHOE_SIZES = ["6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "11.5", "12",
              "13"]
WAIST_SIZES = ["28", "29", "30", "31", "32", "33", "34", "36", "38", "40"]

# name, size system, price range, material/feature phrases, fit notes
CATEGORIES = [
    ("running shoes", "shoe", (59, 169), ["a breathable mesh upper", "a cushioned foam sole",
                                          "reflective details"], "true to size"),
    ("hiking boots", "shoe", (89, 229), ["waterproof leather", "a grippy rubber outsole",
                                         "a padded ankle collar"], "a little roomy"),
    ("canvas sneakers", "shoe", (39, 89), ["organic cotton canvas", "a vulcanized sole"],
     "true to size"),
    ("leather loafers", "shoe", (79, 189), ["full-grain leather", "a cushioned insole"],
     "slightly narrow"),
    ("sandals", "shoe", (29, 79), ["adjustable straps", "a contoured footbed"], "true to size"),
    ("t-shirt", "apparel", (15, 39), ["soft organic cotton", "a relaxed fit"], "true to size"),
    ("hoodie", "apparel", (45, 95), ["a brushed fleece lining", "a kangaroo pocket"],
     "relaxed and roomy"),
    ("rain jacket", "apparel", (79, 199), ["a waterproof shell", "sealed seams",
                                           "a packable hood"], "true to size"),
    ("wool sweater", "apparel", (59, 139), ["merino wool", "ribbed cuffs"], "slightly slim"),
    ("linen shirt", "apparel", (39, 89), ["breathable linen", "mother-of-pearl buttons"],
     "true to size"),
    ("fleece jacket", "apparel", (49, 129), ["recycled polyester fleece", "zip pockets"],
     "true to size"),
    ("puffer jacket", "apparel", (99, 249), ["recycled down fill", "water-resistant shell"],
     "a little roomy"),
    ("running shorts", "apparel", (25, 55), ["quick-dry fabric", "a built-in liner"],
     "true to size"),
    ("leggings", "apparel", (35, 85), ["four-way stretch", "a high waist"], "snug"),
    ("jeans", "waist", (49, 129), ["stretch denim", "a classic five-pocket design"],
     "true to size"),
    ("chinos", "waist", (45, 99), ["cotton twill", "a tapered leg"], "slightly slim"),
    ("backpack", "none", (49, 179), ["a padded laptop sleeve", "water-resistant fabric"], ""),
    ("duffel bag", "none", (59, 149), ["heavy canvas", "a detachable shoulder strap"], ""),
    ("tote bag", "none", (19, 69), ["sturdy cotton", "an inner zip pocket"], ""),
    ("wireless earbuds", "none", (49, 199), ["active noise cancelling",
                                             "up to 8 hours of battery life"], ""),
    ("bluetooth speaker", "none", (39, 149), ["a waterproof body", "a 12-hour battery"], ""),
    ("noise-cancelling headphones", "none", (99, 349), ["over-ear cushions",
                                                        "30-hour battery life"], ""),
    ("smartwatch", "none", (99, 299), ["a heart-rate sensor", "a five-day battery"], ""),
    ("power bank", "none", (25, 79), ["a 10,000 mAh capacity", "USB-C fast charging"], ""),
    ("phone case", "none", (15, 45), ["shock-absorbing edges", "a raised camera lip"], ""),
    ("desk lamp", "none", (29, 119), ["a dimmable LED", "an adjustable arm"], ""),
    ("ceramic mug", "none", (12, 29), ["a dishwasher-safe glaze", "a 350 ml capacity"], ""),
    ("water bottle", "none", (19, 45), ["double-wall insulation", "a leak-proof lid"], ""),
    ("throw blanket", "none", (35, 99), ["a chunky knit", "a machine-washable finish"], ""),
    ("cast iron pan", "none", (29, 89), ["a pre-seasoned surface", "an oven-safe handle"], ""),
    ("scented candle", "none", (15, 39), ["soy wax", "about 40 hours of burn time"], ""),
    ("yoga mat", "none", (25, 89), ["a non-slip surface", "6 mm cushioning"], ""),
    ("sunglasses", "none", (29, 149), ["polarized lenses", "UV400 protection"], ""),
    ("wallet", "none", (25, 79), ["vegetable-tanned leather", "RFID blocking"], ""),
]

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]


# ---------------------------------------------------------------- world


class World:
    """Slots shared by every turn of one conversation."""

    def __init__(self, r, default_store=False):
        self.r = r
        self.store, self.store_kind = r.choice(STORES)
        if default_store:
            self.store, self.store_kind = DEFAULT_STORE
        self.agent = r.choice(AGENT_NAMES)
        self.first = r.choice(FIRST_NAMES)
        self.last = r.choice(LAST_NAMES)
        self.email = "{}.{}{}@{}".format(self.first.lower(), self.last.lower(),
                                        r.choice(["", "", str(r.randint(1, 99))]),
                                        r.choice(EMAIL_DOMAINS))
        self.today = dt.date(2025, 1, 1) + dt.timedelta(days=r.randint(0, 729))
        self.return_days = r.choice([14, 30, 30, 30, 45, 60, 90])
        self.free_ship = r.choice([25, 35, 50, 50, 75, 100])
        self.std_days = r.choice(["3-5", "3-5", "2-4", "4-7", "5-7"])
        self.exp_days = r.choice(["1-2", "1-2", "2"])
        self.exp_cost = r.choice(["9.99", "12.99", "14.99", "19.99"])
        self.std_cost = r.choice(["4.99", "5.99", "6.95", "7.99"])
        self.refund_days = r.choice(["3-5", "5-7", "5-10", "7-10"])
        self.hours = r.choice(["9am to 6pm Eastern, Monday to Friday",
                               "8am to 8pm, seven days a week",
                               "10am to 5pm Pacific on weekdays", "around the clock"])
        self.phone = "1-800-{}-{:04d}".format(r.randint(200, 999), r.randint(0, 9999))
        self.product_cache = []

    # -- entities
    def order_no(self):
        return str(self.r.randint(10, 99)) + str(self.r.randint(10000, 99999))

    def product(self):
        r = self.r
        name, system, (lo, hi), feats, fit = r.choice(CATEGORIES)
        colours = r.sample(COLOURS, r.randint(2, 5))
        if system == "shoe":
            i = r.randint(0, 4)
            sizes = SHOE_SIZES[i:i + r.randint(8, 10)]
        elif system == "apparel":
            sizes = APPAREL_SIZES[r.randint(0, 1):r.randint(5, 6)]
        elif system == "waist":
            sizes = WAIST_SIZES[r.randint(0, 2):]
        else:
            sizes = []
        price = "{}.{}".format(r.randint(lo, hi), r.choice(["99", "99", "95", "00", "50"]))
        p = dict(name="{} {}".format(r.choice(MODEL_NAMES), name), kind=name, system=system,
                 colours=colours, sizes=sizes, price=price, feats=feats, fit=fit,
                 pl=name.endswith("s"))
        self.product_cache.append(p)
        return p

    def date(self, offset_days, weekday=None):
        d = self.today + dt.timedelta(days=offset_days)
        if weekday is None:
            weekday = self.r.random() < 0.5
        s = "{} {}".format(MONTHS[d.month - 1], d.day)
        return "{}, {}".format(WEEKDAYS[d.weekday()], s) if weekday else s

    def address(self):
        r = self.r
        city, state, zp = r.choice(CITIES)
        return "{} {} {}, {}, {} {}{:03d}".format(r.randint(2, 9899), r.choice(STREETS),
                                                 r.choice(STREET_TYPES), city, state, zp,
                                                 r.randint(0, 999))

    def tracking(self, carrier):
        r = self.r
        if carrier == "UPS":
            return "1Z" + "".join(r.choice("0123456789ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(10))
        if carrier == "FedEx":
            return "".join(r.choice("0123456789") for _ in range(12))
        if carrier == "USPS":
            return "9400" + "".join(r.choice("0123456789") for _ in range(12))
        return "".join(r.choice("0123456789") for _ in range(10))

    def money(self, lo, hi):
        return "{}.{}".format(self.r.randint(lo, hi), self.r.choice(["99", "00", "50", "95", "49"]))


# ---------------------------------------------------------------- phrasing helpers


def pick(r, xs):
    return r.choice(xs)


def agree(p, s):
    """Resolve "{is|are}"-style alternatives by the product's grammatical number."""
    out, i = [], 0
    while True:
        j = s.find("{", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        k = s.find("}", j)
        body = s[j + 1:k]
        if "|" in body:
            sing, plur = body.split("|")
            out.append(s[i:j] + (plur if p["pl"] else sing))
        else:
            out.append(s[i:k + 1])
        i = k + 1


def user_style(r, s):
    """Customers type casually: sometimes lower-case, sometimes without final punctuation."""
    x = r.random()
    if x < 0.18:
        s = s.lower()
    elif x < 0.22:
        s = s[0].lower() + s[1:]
    if r.random() < 0.2 and s and s[-1] in ".?!":
        s = s[:-1]
    if r.random() < 0.05:
        s = s + pick(r, ["!!", " thanks", " pls", " asap"])
    return s


def join(r, *parts):
    return " ".join(p for p in parts if p)


def sometimes(r, p, s):
    return s if r.random() < p else ""


def colour_list(cs):
    if len(cs) == 1:
        return cs[0]
    return ", ".join(cs[:-1]) + " and " + cs[-1]


def size_range(p):
    if not p["sizes"]:
        return ""
    if p["system"] == "waist":
        return "waist sizes {} to {}".format(p["sizes"][0], p["sizes"][-1])
    return "sizes {} to {}".format(p["sizes"][0], p["sizes"][-1])


ACKS = ["Sure!", "Of course.", "Happy to help!", "Absolutely.", "Certainly.", "No problem.",
        "Sure thing.", "I can help with that.", "I'd be glad to help with that.", "Got it."]
SORRY = ["I'm sorry about that.", "I'm really sorry for the trouble.",
         "Sorry for the inconvenience.", "I apologize for the trouble.",
         "I'm sorry to hear that.", "That's frustrating, I'm sorry.",
         "I understand, and I'm sorry for the hassle."]
THANKS_USER = ["thanks!", "Thank you!", "Thanks a lot.", "great, thank you", "Perfect, thanks!",
               "ok thanks", "That helps, thanks.", "Awesome, thank you so much!", "cool thx",
               "Thanks for your help.", "Great, that's all I needed.", "Brilliant, cheers!",
               "ok great", "Appreciate it!"]
CLOSE_ASSIST = ["You're welcome! Have a great day.", "Happy to help! Have a wonderful day.",
                "You're very welcome. Enjoy your {day}!", "Anytime! Take care.",
                "Glad I could help. Is there anything else I can do for you?",
                "My pleasure! Let us know if you need anything else.",
                "You're welcome, {name}! Have a great {day}.",
                "Thanks for shopping with {store}. Have a lovely day!",
                "You're welcome! Feel free to reach out if anything else comes up."]
BYE_USER = ["no that's all, bye", "That's everything, thanks!", "Nope, all good.",
            "No, that's it.", "all set, thank you", "Nothing else, thanks!", "bye!"]
BYE_ASSIST = ["Great! Have a wonderful day.", "Thanks for reaching out. Goodbye!",
              "Take care, and thanks for choosing {store}!", "Have a great day, {name}!",
              "Perfect. Thanks for contacting {store}!", "Bye for now, and enjoy your order!"]


def fill(w, s):
    day = pick(w.r, ["day", "evening", "weekend", "week"])
    return s.format(store=w.store, name=w.first, day=day, agent=w.agent)


def order_ref(w, no):
    return pick(w.r, ["#" + no, no, "order " + no, "order #" + no, "order number " + no])


# ---------------------------------------------------------------- system prompts


def system_prompt(w):
    r = w.r
    base = pick(r, [
        "You are a friendly customer-service assistant for {store}, an online shop selling {kind}.",
        "You are {agent}, a customer-support agent at {store}, an online store for {kind}.",
        "You are the virtual assistant of {store}. {store} sells {kind} online.",
        "You work in customer support for {store}, which sells {kind}.",
        "You are a helpful support assistant for the online shop {store}.",
        "You are {store}'s customer service chatbot.",
    ]).format(store=w.store, kind=w.store_kind, agent=w.agent)
    extra = []
    if r.random() < 0.5:
        extra.append(pick(r, [
            "Help customers with orders, shipping, returns, refunds, payments, products and "
            "account questions.",
            "Answer questions about orders, deliveries, returns and products.",
            "Assist customers with their orders and questions about our products.",
        ]))
    if r.random() < 0.5:
        extra.append(pick(r, ["Be concise and polite.", "Keep answers short and friendly.",
                              "Be warm, clear and brief.", "Always be polite and helpful.",
                              "Answer in a few sentences."]))
    if r.random() < 0.4:
        extra.append("Today is {}, {}.".format(w.date(0, weekday=True), w.today.year))
    if r.random() < 0.35:
        pol = [
            "Returns are accepted within {} days of delivery.".format(w.return_days),
            "Standard shipping takes {} business days and is free on orders over ${}.".format(
                w.std_days, w.free_ship),
            "Refunds are processed within {} business days.".format(w.refund_days),
            "Support hours are {}.".format(w.hours),
        ]
        r.shuffle(pol)
        extra.extend(pol[:r.randint(1, 4)])
    if r.random() < 0.2:
        extra.append("If a customer asks for a human, offer to create a support ticket.")
    parts = [base] + extra
    return " ".join(parts)


# ---------------------------------------------------------------- intents
# Each intent appends (role, text) turns through the Convo helper.


class Convo:
    def __init__(self, w):
        self.w = w
        self.turns = []

    def u(self, s):
        self.turns.append(("user", user_style(self.w.r, fill(self.w, s))))

    def a(self, s):
        self.turns.append(("assistant", fill(self.w, s)))

    def follow_up(self, questions, answers):
        """The user asks one of `questions`; the assistant gives the first answer of `answers`,
        (keywords, answer), with a keyword in the question (lower-cased; one keyword may stand
        alone; None matches any). An answer that is a function is called only then: it may draw
        from the world."""
        self.u(pick(self.w.r, questions))
        last = self.turns[-1][1].lower()
        for keys, answer in answers:
            keys = (keys,) if isinstance(keys, str) else keys
            if keys is None or any(k in last for k in keys):
                self.a(answer() if callable(answer) else answer)
                return


def ask_order_number(w):
    return pick(w.r, [
        "Could you share your order number?",
        "Can you give me your order number so I can look it up?",
        "What's the order number? You'll find it in your confirmation email.",
        "Please send me the order number and I'll check.",
        "May I have your order number, please?",
        "Could you tell me the order number? It starts with the digits in your confirmation "
        "email.",
        "Sure, what's your order number?",
    ])


def give_order_number(w, no):
    return pick(w.r, [
        "It's {}.", "{}", "Order number is {}.", "sure, it's {}", "The order number is {}.",
        "{} I think", "Here it is: {}", "yes it's {}", "#{}".replace("#", "") + "",
    ]).format(no if w.r.random() < 0.7 else "#" + no)


def intent_order_status(c):
    w, r = c.w, c.w.r
    no = w.order_no()
    p = w.product()
    carrier = pick(r, CARRIERS)
    tr = w.tracking(carrier)
    eta = r.randint(1, 6)
    q = pick(r, [
        "Where is my order?", "Hi, can you tell me where my order is?",
        "I'd like to check the status of my order.", "Has my order shipped yet?",
        "When will my order arrive?", "Can you track my package?",
        "What's the status of my {p}?", "I ordered {a }{p} last week. Any update?",
        "How do I track my order?", "I haven't received a shipping email yet. Did my order ship?",
        "Is my order on its way?", "I need an update on my delivery.",
    ]).replace("{a }", "" if p["pl"] else "a ").replace(
        "{p}", p["name"] if r.random() < 0.5 else p["kind"])
    if r.random() < 0.4:
        c.u(q + " " + pick(r, ["It's order {}.", "Order number {}.", "({})",
                               "The order number is {}."]).format(order_ref(w, no)))
    else:
        c.u(q)
        c.a(ask_order_number(w))
        c.u(give_order_number(w, no))
    status = r.random()
    if status < 0.55:
        c.a(join(r, pick(r, ["Thanks!", "Thanks, I found it.", "Got it.", "Thank you."]),
                 pick(r, ["Order #{no} shipped on {ship} with {car}.",
                          "Your order #{no} is on its way with {car}.",
                          "Good news: order #{no} has shipped via {car}.",
                          "Order #{no} left our warehouse on {ship} and is in transit with {car}."]),
                 pick(r, ["It's expected to arrive on {eta}.", "Estimated delivery is {eta}.",
                          "It should reach you by {eta}.", "The expected delivery date is {eta}."]),
                 sometimes(r, 0.7, pick(r, ["Your tracking number is {tr}.",
                                            "You can track it with tracking number {tr}.",
                                            "The tracking number is {tr}."])))
            .format(no=no, ship=w.date(-r.randint(1, 3)), car=carrier, eta=w.date(eta), tr=tr))
        if r.random() < 0.5:
            c.follow_up(["Can it be delivered to my work address instead?",
                         "Will I need to sign for it?", "Can I get it any faster?",
                         "What if I'm not home?", "Where can I enter the tracking number?",
                         "Why is it taking so long?"], [
                ("work address", lambda:
                 "Since the package has already shipped, I can't change the address on our "
                 "side, but you can request a redirect through {}'s website with the "
                 "tracking number {}.".format(carrier, tr)),
                ("sign", lambda:
                 pick(r, ["No signature is needed for this order. The driver will leave it "
                          "in a safe place.",
                          "Orders over $500 need a signature, so this one will just be left "
                          "at your door."])),
                ("faster", lambda:
                 "Once an order has shipped we can't upgrade the shipping speed, I'm sorry. "
                 "It's still on track for {}.".format(w.date(eta))),
                ("not home", lambda:
                 "If you're not home, {} will leave it in a safe place or leave a note with "
                 "pickup options. You can also set delivery preferences with your tracking "
                 "number.".format(carrier)),
                ("tracking", lambda:
                 "You can enter it on {}'s website or in the Orders section of your {} "
                 "account, which shows live updates.".format(carrier, w.store)),
                (None, lambda:
                 "It's moving normally and is on schedule for {}. Carriers can be a bit slow "
                 "to update the tracking page, so don't worry if it hasn't changed in a "
                 "day.".format(w.date(eta))),
            ])
    elif status < 0.8:
        c.a(pick(r, ["Thanks! Order #{no} is being packed right now and should ship within "
                     "1-2 business days.",
                     "I checked order #{no}: it hasn't shipped yet, it's being prepared at our "
                     "warehouse.",
                     "Order #{no} was placed on {od} and is still processing."]).format(
            no=no, od=w.date(-r.randint(0, 2)))
            + " " + pick(r, ["You'll get an email with tracking as soon as it ships.",
                             "Once it ships, we'll email you the tracking number.",
                             "Standard delivery then takes {} business days.".format(w.std_days)]))
        if r.random() < 0.5:
            c.follow_up(["Can I still change something?", "ok, can I still add an item?",
                         "Why hasn't it shipped yet?"], [
                ("why",
                 "Orders usually ship within 1-2 business days. We're seeing higher volume "
                 "than usual, so it's taking a little longer, but it should go out soon."),
                (None,
                 "Since it hasn't shipped yet, I can still make changes. Tell me what you'd "
                 "like to change and I'll update the order."),
            ])
    else:
        c.a(pick(r, ["Order #{no} was delivered on {d}.",
                     "Our records show order #{no} was delivered on {d} by {car}."]).format(
            no=no, d=w.date(-r.randint(1, 3)), car=carrier) + " " + pick(r, [
                "Did you receive it?", "Is it possible it was left with a neighbour?",
                "Has it arrived on your end?"]))
        c.u(pick(r, ["No, I never got it.", "nope, nothing here", "I didn't get anything.",
                     "No, it's not here and I checked with my neighbours."]))
        c.a(pick(r, SORRY) + " " + pick(r, [
            "Sometimes packages are marked delivered a day early, so please check again "
            "tomorrow. If it still hasn't shown up, I'll send a replacement or a full refund.",
            "I've opened a missing-package claim with {car}. If it isn't found within 2 "
            "business days, we'll send a free replacement.",
            "I've reported it to {car} and flagged your order. You can choose between a "
            "replacement and a refund if it doesn't turn up within 48 hours."]).format(
            car=carrier))


def intent_delay(c):
    w, r = c.w, c.w.r
    no = w.order_no()
    days = r.randint(3, 12)
    carrier = pick(r, CARRIERS)
    c.u(pick(r, [
        "My order is late. It was supposed to arrive {d} days ago.",
        "Why is my delivery delayed?", "The tracking hasn't updated in {d} days.",
        "My package still hasn't arrived and it's been over a week.",
        "It says delayed on the tracking page. What's going on?",
        "I was promised delivery by {date} and it's still not here.",
        "Where is my stuff?? It's been {d} days.",
        "My order {ref} is stuck in transit.",
    ]).format(d=days, date=w.date(-r.randint(1, 4), weekday=False),
              ref=pick(r, ["#" + no, no, "(" + no + ")"])))
    if not any(no in t for _, t in c.turns[-1:]):
        c.a(pick(r, SORRY) + " " + ask_order_number(w))
        c.u(give_order_number(w, no))
    new = r.randint(1, 5)
    reason = pick(r, ["severe weather in the area", "a backlog at the {car} sorting facility",
                      "high holiday volume", "a missed scan at the regional hub",
                      "an address verification check"]).format(car=carrier)
    c.a(join(r, pick(r, ["Thanks for waiting.", "Thank you.", "I found it.", ""]),
             "Order #{} is delayed because of {}.".format(no, reason),
             pick(r, ["The new estimated delivery date is {}.", "It should now arrive by {}.",
                      "{car} expects to deliver it on {}."]).replace("{car}", carrier).format(
                 w.date(new)),
             sometimes(r, 0.5, pick(r, SORRY))))
    if r.random() < 0.6:
        c.follow_up(["Can I get a refund on the shipping?", "That's really annoying.",
                     "Can you send a new one instead?", "I need it before the weekend.",
                     "ok, what if it doesn't arrive by then?"], [
            ("refund on the shipping", lambda:
             "I've refunded the shipping cost to your original payment method. It should "
             "appear within {} business days.".format(w.refund_days)),
            ("annoying", lambda:
             pick(r, SORRY) + " I understand. As an apology I've added a 10% discount code "
             "to your account: SORRY10. It works on your next order."),
            (("new one", "doesn't arrive"), lambda:
             "If it hasn't arrived by {}, reply here and I'll send a replacement with "
             "express shipping at no cost.".format(w.date(new + 1))),
            (None,
             "I can't speed up a package that's already in transit, but if it doesn't "
             "arrive in time we can refund the order in full."),
        ])


def intent_return(c):
    w, r = c.w, c.w.r
    no = w.order_no()
    p = w.product()
    reason = agree(p, pick(r, ["{it doesn't|they don't} fit", "{it's|they're} too small",
                               "{it's|they're} too big", "I don't like the colour",
                               "{it looks|they look} different from the photos",
                               "I changed my mind", "the quality isn't what I expected",
                               "I ordered two by mistake"]))
    c.u(pick(r, [
        "I want to return my {p}.", "How do I return an item?",
        "Can I return the {p} I bought? {R}.", "I'd like to send back my {p} because {r}.",
        "What's your return policy?", "Hi, I need to return something.",
        "Is it too late to return my order? I got it {d} days ago.",
        "How can I exchange my {p} for a different size?",
    ]).replace("{p}", p["kind"]).format(R=reason.capitalize(), r=reason,
                                        d=r.randint(3, w.return_days + 20)))
    first = c.turns[-1][1].lower()
    if "policy" in first:
        c.a("You can return most items within {} days of delivery, as long as they're unused "
            "and in their original packaging. {} Would you like to start a return?".format(
                w.return_days, pick(r, ["Returns are free with our prepaid label.",
                                        "Return shipping is free.",
                                        "A return label costs $5.99, which is deducted from "
                                        "the refund."])))
        c.u(pick(r, ["yes please", "Yes, for my {}.".format(p["kind"]), "Yes, let's do it."]))
    m = None
    if "days ago" in first:
        m = int(first.split(" days ago")[0].split()[-1])
    c.a(pick(r, ACKS) + " " + ask_order_number(w))
    c.u(give_order_number(w, no))
    if m is not None and m > w.return_days:
        c.a("Thanks. I'm sorry, but order #{} was delivered {} days ago, and our return window "
            "is {} days, so it's no longer eligible for a return. If the item is faulty, it may "
            "still be covered by the warranty.".format(no, m, w.return_days))
        return
    exchange = "exchange" in first
    label = pick(r, ["I've emailed you a prepaid return label.",
                     "A prepaid return label is on its way to {}.".format(w.email),
                     "You'll find the return label in your inbox in a few minutes."])
    if exchange:
        size = pick(r, p["sizes"]) if p["sizes"] else None
        c.a("Thanks! Which size would you like instead?" if size else
            "Thanks! What would you like to exchange it for?")
        c.u(pick(r, ["{} please", "Size {}.", "Could I get a {}?", "I need a {}"]).format(size)
            if size else pick(r, ["the same one in {}".format(pick(r, p["colours"])),
                                  "A different colour, {}.".format(pick(r, p["colours"]))]))
        c.a("Done! I've set up the exchange for order #{}. {} Once we scan the return, we'll "
            "ship the new one right away.".format(no, label))
    else:
        c.a(agree(p, "Thanks! Order #{} is eligible for a return. {} Pack the {} in "
            "{its|their} original packaging and drop it off at any {} location within {} days. Your refund will "
            "be issued once {it arrives|they arrive} at our warehouse.").format(
                no, label, p["kind"], pick(r, CARRIERS), r.choice([7, 14])))
    if r.random() < 0.5:
        c.follow_up(["How long does the refund take?", "Do I need the original box?",
                     "Can I return it in a store instead?", "Is the return shipping free?"], [
            ("refund", lambda:
             "Refunds are issued within {} business days after we receive the item, back "
             "to your original payment method.".format(w.refund_days)),
            ("box",
             "The original packaging is preferred, but any sturdy box works as long as the "
             "item is protected."),
            ("store", lambda:
             "{} is online only, so returns have to be mailed back, but the label makes it "
             "easy.".format(w.store)),
            (None, lambda:
             pick(r, ["Yes, the return label is free for you.",
                      "Return shipping is free for exchanges and faulty items; for other "
                      "returns $5.99 is deducted from your refund."])),
        ])


def intent_refund(c):
    w, r = c.w, c.w.r
    no = w.order_no()
    amt = w.money(15, 260)
    c.u(pick(r, [
        "When will I get my refund?", "I returned my order two weeks ago and still no refund.",
        "Has my refund been processed?", "I'm still waiting for my money back.",
        "Where's my refund for order {ref}?", "Can you check on a refund for me?",
        "I was told I'd get a refund but I haven't seen it yet.",
    ]).format(ref=order_ref(w, no)))
    if no not in c.turns[-1][1]:
        c.a(pick(r, ["I can check that for you.", "Let me look into it.", "Sure."]) + " " +
            ask_order_number(w))
        c.u(give_order_number(w, no))
    state = r.random()
    if state < 0.5:
        c.a("Thanks. The refund of ${} for order #{} was issued on {}. It can take {} "
            "business days for your bank to show it.".format(amt, no, w.date(-r.randint(1, 4)),
                                                           w.refund_days))
        if r.random() < 0.5:
            c.follow_up(["It's been longer than that.", "Which card will it go to?",
                         "Can you send it to a different card?"], [
                ("longer", lambda:
                 pick(r, SORRY) + " I've escalated it to our payments team with reference "
                 "RF-{}. They'll email you within 24 hours.".format(r.randint(10000, 99999))),
                ("which card", lambda:
                 "It goes back to the card you paid with, the one ending in {}.".format(
                 r.randint(1000, 9999))),
                (None,
                 "Refunds can only go back to the original payment method, I'm afraid. "
                 "If that card is closed, your bank will pass the money to your new card."),
            ])
    elif state < 0.8:
        c.a("Thanks! We received your return for order #{} on {}. It's being inspected now, "
            "and the refund of ${} will be issued within 2 business days.".format(
                no, w.date(-r.randint(0, 3)), amt))
    else:
        c.a("I checked order #{}, and we haven't received the return yet. The tracking shows "
            "it's still on its way to our warehouse. The refund is issued as soon as it "
            "arrives.".format(no))
        c.u(pick(r, ["But I sent it ages ago!", "ok, how long does that usually take?"]))
        c.a("Returns usually take 5-10 business days to reach us. If it hasn't arrived by {}, "
            "let me know and I'll open a trace with the carrier.".format(w.date(7)))


def intent_payment(c):
    w, r = c.w, c.w.r
    kind = r.random()
    if kind < 0.35:
        c.u(pick(r, ["My card keeps getting declined.", "Payment failed at checkout.",
                     "Why was my payment declined?", "I can't pay, it says card declined.",
                     "Checkout won't accept my credit card."]))
        c.a(pick(r, SORRY) + " " + pick(r, [
            "Declines usually come from the bank. Please check that the billing address and "
            "card details match what your bank has on file.",
            "Most declines happen when the billing ZIP code doesn't match the card, or the bank "
            "blocks an online purchase.",
        ]) + " " + pick(r, ["You can also pay with PayPal, Apple Pay or a gift card.",
                            "If it keeps failing, try another card or PayPal.",
                            "Calling your bank usually clears it in a few minutes."]))
        if r.random() < 0.5:
            c.follow_up(["Do you accept Klarna?", "Can I pay by bank transfer?",
                         "do you take amex?"], [
                ("klarna",
                 "Yes, Klarna is available at checkout for orders over $35. It lets you "
                 "pay in four interest-free instalments."),
                ("transfer",
                 "We don't accept bank transfers, sorry. We take Visa, Mastercard, American "
                 "Express, PayPal, Apple Pay and gift cards."),
                (None,
                 "Yes, we accept American Express, as well as Visa, Mastercard and PayPal."),
            ])
    elif kind < 0.65:
        amt = w.money(10, 300)
        no = w.order_no()
        c.u(pick(r, ["I was charged twice for my order.", "There are two charges of ${a} on my "
                     "card.", "Why did you charge me twice?", "I see a double charge of ${a}."])
            .format(a=amt))
        c.a(pick(r, SORRY) + " " + ask_order_number(w))
        c.u(give_order_number(w, no))
        c.a(pick(r, [
            "Thanks. I see only one completed charge for order #{no}. The second one is a "
            "temporary authorization hold, and your bank will release it within 3-5 business "
            "days.",
            "You're right, order #{no} was charged twice because of a checkout error. I've "
            "refunded the duplicate ${a}; it will show up within {d} business days.",
        ]).format(no=no, a=amt, d=w.refund_days))
    else:
        code = pick(r, ["SAVE10", "WELCOME15", "SPRING20", "FREESHIP", "VIP25", "HOLIDAY30"])
        c.u(pick(r, ["My promo code {c} isn't working.", "The discount code {c} says invalid.",
                     "Why can't I use code {c}?", "I forgot to use my discount code {c}, can "
                     "you apply it?"]).format(c=code))
        last = c.turns[-1][1].lower()
        if "forgot" in last:
            no = w.order_no()
            c.a("No problem. " + ask_order_number(w))
            c.u(give_order_number(w, no))
            c.a("I've applied {} to order #{} and refunded the difference of ${}. It will show "
                "up within {} business days.".format(code, no, w.money(4, 40), w.refund_days))
        else:
            c.a(pick(r, [
                "The code {c} expired on {d}, I'm sorry. Right now you can use WELCOME10 for "
                "10% off your order.",
                "{c} only applies to orders over ${m}. Your cart is just under that, so adding "
                "one more item should make it work.",
                "{c} can't be combined with items that are already on sale. It will work on "
                "full-price items in your cart.",
            ]).format(c=code, d=w.date(-r.randint(2, 30), weekday=False), m=w.free_ship))


def intent_product(c):
    w, r = c.w, c.w.r
    p = w.product()
    q = r.random()
    name = p["name"]

    def ag(t):
        return agree(p, t)

    if q < 0.3 and p["sizes"]:
        c.u(ag(pick(r, ["What size should I get in the {n}?", "{Does|Do} the {n} run small?",
                        "How {does|do} the {n} fit?",
                        "I'm usually a {s}. What size {k} should I order?",
                        "{Is|Are} the {n} true to size?", "which size do I need for the {n}?"]))
            .format(n=name, k=p["kind"], s=pick(r, p["sizes"])))
        c.a(ag(pick(r, ["The {n} {fits|fit} {fit}.", "Customers say the {n} {fits|fit} {fit}."]))
            .format(n=name, fit=p["fit"]) + " " + pick(r, [
                "If you're between sizes, I'd go one size up.",
                "Most people order their usual size.",
                "You can check the size chart on the product page for exact measurements."])
            + " " + ag("{It comes|They come} in {}.").format(size_range(p)))
        if r.random() < 0.5:
            c.u(ag(pick(r, ["And if {it doesn't|they don't} fit?",
                            "Can I exchange {it|them} if the size is wrong?"])))
            c.a("No problem: exchanges are free within {} days, so you can swap {} for another "
                "size.".format(w.return_days, ag("{it|them}")))
    elif q < 0.55:
        want = pick(r, COLOURS)
        c.u(ag(pick(r, ["{Does|Do} the {n} come in {c}?", "What colours {does|do} the {n} come in?",
                        "{Is|Are} the {n} available in {c}?", "do you have the {k} in {c}?",
                        "Which colors {is|are} the {n} available in?"]))
            .format(n=name, c=want, k=p["kind"]))
        has = want in p["colours"]
        asked_specific = want in c.turns[-1][1].lower()
        others = [x for x in p["colours"] if x != want]
        if asked_specific and has:
            c.a(ag("Yes, the {} {comes|come} in {}. {It's|They're} also available in {}.")
                .format(name, want, colour_list(others)))
        elif asked_specific:
            c.a(ag("Sorry, the {} {doesn't|don't} come in {}. {It's|They're} available in {}.")
                .format(name, want, colour_list(p["colours"])))
        else:
            c.a(ag("The {} {comes|come} in {}.").format(name, colour_list(p["colours"])))
    elif q < 0.78:
        size = pick(r, p["sizes"]) if p["sizes"] else None
        col = pick(r, p["colours"])
        c.u(ag(pick(r, ["{Is|Are} the {n} in stock?", "Do you have the {n} in {col}{sz}?",
                        "When will the {n} be back in stock?",
                        "{is|are} the {k} in {col} available?"]))
            .format(n=name, col=col, k=p["kind"], sz=" size " + size if size else ""))
        if r.random() < 0.55:
            c.a(ag("Yes, the {} in {}{} {is|are} in stock and {ships|ship} within 1 business "
                   "day.").format(name, col, " size " + size if size else ""))
        else:
            c.a(ag("The {} in {}{} {is|are} out of stock right now. We expect {it|them} back "
                   "around {}. {}").format(
                name, col, ", size " + size if size else "",
                w.date(r.randint(7, 30), weekday=False),
                pick(r, ["You can tap 'Notify me' on the product page to get an email when "
                         + ag("{it's|they're} back."),
                         "Would you like me to sign you up for a restock alert?",
                         ag("In the meantime, {it's|they're} available in {}.").format(
                             colour_list([x for x in p["colours"] if x != col]))])))
            if c.turns[-1][1].endswith("restock alert?"):
                c.u(pick(r, ["yes please", "Sure, sign me up.", "Yes!"]))
                c.a(ag("Done! We'll email you at {} as soon as {it's|they're} back in stock.")
                    .format(w.email))
    else:
        c.u(ag(pick(r, ["How much {is|are} the {n}?", "What's the price of the {n}?",
                        "{Is|Are} the {n} on sale?", "Tell me about the {n}.",
                        "What {is|are} the {n} made of?", "What features {does|do} the {n} "
                        "have?"])).format(n=name))
        last = c.turns[-1][1].lower()
        if "sale" in last:
            c.a(ag(pick(r, ["The {n} {is|are} ${p} right now. {It's|They're} not on sale at the "
                            "moment, but you can get 10% off your first order by signing up "
                            "for our newsletter.",
                            "Yes! The {n} {is|are} 20% off this week, so {it's|they're} ${s} "
                            "instead of ${p}."]))
                .format(n=name, p=p["price"], s="{:.2f}".format(float(p["price"]) * 0.8)))
        elif "made of" in last or "tell me" in last or "features" in last:
            c.a(ag("The {} {has|have} {} and {}. {It costs|They cost} ${}{}.").format(
                name, p["feats"][0], p["feats"][-1] if len(p["feats"]) > 1 else "a one-year "
                "warranty", p["price"], (" and come" if p["pl"] else " and comes") + " in "
                + colour_list(p["colours"]) if r.random() < 0.5 else ""))
        else:
            c.a(ag("The {} {costs|cost} ${}. {}").format(name, p["price"], pick(r, [
                "Shipping is free on orders over ${}.".format(w.free_ship),
                ag("{It comes|They come} in {}.").format(colour_list(p["colours"])),
                ag("{It's|They're} in stock and {ships|ship} within 1 business day.")])))


def intent_account(c):
    w, r = c.w, c.w.r
    k = r.random()
    if k < 0.35:
        c.u(pick(r, ["I can't log in to my account.", "I forgot my password.",
                     "How do I reset my password?", "It says my password is wrong.",
                     "I'm locked out of my account."]))
        c.a(pick(r, ["No worries.", "I can help with that.", "Let's get you back in."]) + " " +
            "Click 'Forgot password' on the sign-in page and enter your email address. You'll "
            "get a reset link within a few minutes. " +
            pick(r, ["Check your spam folder if you don't see it.",
                     "The link is valid for 24 hours.",
                     "After five failed attempts the account is locked for 30 minutes."]))
        if r.random() < 0.5:
            c.follow_up(["I don't get the email.", "I don't have access to that email "
                         "anymore.", "the reset link doesn't work"], [
                ("access",
                 "For your security I can't change the email in chat, but I can open a "
                 "verification ticket. Please reply with your full name and the last "
                 "order number, and our account team will contact you."),
                (None, lambda:
                 "Sorry about that. I've sent a new reset link to {}. It should arrive in "
                 "the next few minutes.".format(w.email)),
            ])
    elif k < 0.6:
        new = "{}.{}@{}".format(w.first.lower(), w.last.lower(), pick(r, EMAIL_DOMAINS))
        c.u(pick(r, ["How do I change my email address?", "I want to update my email to {e}.",
                     "Can you change the email on my account?"]).format(e=new))
        c.a("You can change it under Account > Settings > Email. We'll send a confirmation "
            "link to the new address, and the change takes effect once you click it.")
    elif k < 0.8:
        c.u(pick(r, ["Please delete my account.", "How do I close my account?",
                     "I want you to remove all my data."]))
        c.a("I can help with that. Deleting your account removes your order history and saved "
            "addresses, and it can't be undone. " + pick(r, [
                "You can do it under Account > Privacy > Delete account.",
                "I've sent a confirmation email to {}; the account is deleted once you confirm."
                .format(w.email)]))
    else:
        addr = w.address()
        no = w.order_no()
        c.u(pick(r, ["I need to change the shipping address on my order.",
                     "Can I update my delivery address?", "I moved, can you send my order to "
                     "{a} instead?", "wrong address on order {ref}!"]).format(
            a=addr, ref=order_ref(w, no)))
        if no not in c.turns[-1][1]:
            c.a(pick(r, ACKS) + " " + ask_order_number(w))
            c.u(give_order_number(w, no))
        if addr not in " ".join(t for _, t in c.turns):
            c.a("Thanks. What's the new address?")
            c.u(pick(r, ["{}", "It's {}.", "new address: {}"]).format(addr))
        if r.random() < 0.7:
            c.a("Done! Order #{} will now ship to {}. You'll get an updated confirmation "
                "email.".format(no, addr))
        else:
            c.a("I'm sorry, order #{} has already shipped, so I can't change the address. You "
                "can ask the carrier to redirect it with the tracking number in your shipping "
                "email.".format(no))


def intent_cancel(c):
    w, r = c.w, c.w.r
    no = w.order_no()
    c.u(pick(r, ["I want to cancel my order.", "Can I cancel order {ref}?",
                 "Please cancel my order, I ordered the wrong thing.",
                 "How do I cancel an order?", "I need to cancel asap"]).format(
        ref=order_ref(w, no)))
    if no not in c.turns[-1][1]:
        c.a(pick(r, ACKS) + " " + ask_order_number(w))
        c.u(give_order_number(w, no))
    if r.random() < 0.65:
        c.a("Order #{} hasn't shipped yet, so I've cancelled it. You'll get a full refund of "
            "${} within {} business days.".format(no, w.money(15, 250), w.refund_days))
    else:
        c.a("I'm sorry, order #{} has already shipped, so it can't be cancelled. Once it "
            "arrives you can return it within {} days for a full refund.".format(
                no, w.return_days))


def intent_damaged(c):
    w, r = c.w, c.w.r
    no = w.order_no()
    p = w.product()
    prob = agree(p, pick(r, ["arrived broken", "arrived damaged", "{has|have} a scratch",
                             "{is|are} missing a part", "{doesn't|don't} work",
                             "{is|are} the wrong size", "{is|are} the wrong colour",
                             "{isn't|aren't} what I ordered"]))
    c.u(pick(r, ["My {k} {pr}.", "The {k} I received {pr}!", "Hi, my order came today but "
                 "the {k} {pr}.", "I got my package and the {k} {pr}. What can I do?"])
        .format(k=p["kind"], pr=prob))
    c.a(pick(r, SORRY) + " " + ask_order_number(w))
    c.u(give_order_number(w, no))
    if r.random() < 0.5:
        c.a("Thank you. Could you send a photo of the {}? That helps us report it to the "
            "warehouse.".format(p["kind"]))
        c.u(pick(r, ["ok, I've attached it.", "Sent!", "here you go", "Done, just uploaded "
                     "it."]))
    c.a(pick(r, ["Thanks.", "Thank you, I can see the problem.", "Got it, thanks."]) + " " +
        pick(r, ["I've sent you a replacement with express shipping; it should arrive by "
                 "{d}. You don't need to send the old one back.",
                 "Would you prefer a replacement or a full refund?",
                 "I've issued a full refund of ${m} to your original payment method. You can "
                 "keep or recycle the item."]).format(
            k=p["kind"], d=w.date(r.randint(2, 4)), m=p["price"]))
    if c.turns[-1][1].endswith("full refund?"):
        c.u(pick(r, ["a replacement please", "refund please", "I'll take the replacement.",
                     "Just refund me."]))
        if "replacement" in c.turns[-1][1].lower():
            c.a("Done! A replacement for the {} is on its way and should arrive by {}."
                .format(p["kind"], w.date(r.randint(2, 5))))
        else:
            c.a("Done! I've refunded ${} for the {}. It will show up within {} business "
                "days.".format(p["price"], p["kind"], w.refund_days))


def intent_shipping_info(c):
    w, r = c.w, c.w.r
    q = pick(r, ["How much is shipping?", "Do you offer free shipping?",
                 "How long does delivery take?", "Do you ship internationally?",
                 "Do you ship to Canada?", "What are your shipping options?",
                 "Can I get next-day delivery?", "do you deliver on weekends?"])
    c.u(q)
    ql = q.lower()
    if "international" in ql or "canada" in ql:
        c.a(pick(r, ["Yes, we ship to Canada, the UK and most of the EU. International "
                     "delivery takes 7-14 business days, and duties may apply on arrival.",
                     "Right now we only ship within the United States, sorry. We hope to add "
                     "international shipping soon."]))
    elif "weekend" in ql:
        c.a("Our carriers deliver Monday to Saturday. Orders placed on the weekend ship on the "
            "next business day.")
    elif "next-day" in ql:
        c.a("Express shipping takes {} business days and costs ${}. Order before 2pm for "
            "same-day dispatch.".format(w.exp_days, w.exp_cost))
    else:
        c.a("Standard shipping takes {} business days and costs ${}, and it's free on orders "
            "over ${}. Express shipping takes {} business days for ${}.".format(
                w.std_days, w.std_cost, w.free_ship, w.exp_days, w.exp_cost))


def intent_gift_card(c):
    w, r = c.w, c.w.r
    code = "GC-" + "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(8))
    if r.random() < 0.5:
        c.u(pick(r, ["How do I check my gift card balance?", "What's the balance on gift "
                     "card {g}?", "Can you tell me how much is left on my gift card?"])
            .format(g=code))
        if code not in c.turns[-1][1]:
            c.a("Sure! Please send me the gift card code. It starts with GC-.")
            c.u(pick(r, ["{}", "It's {}.", "code is {}"]).format(code))
        c.a("Gift card {} has a balance of ${}. It doesn't expire, and you can use it at "
            "checkout.".format(code, w.money(5, 150)))
    else:
        c.u(pick(r, ["Do you sell gift cards?", "Can I buy a gift card for a friend?",
                     "I want to send a gift card."]))
        c.a("Yes! Digital gift cards from $10 to $500 are available on our Gift Cards page. "
            "They're delivered by email on the date you choose and never expire.")


def intent_escalation(c):
    w, r = c.w, c.w.r
    c.u(pick(r, ["I want to talk to a real person.", "Can I speak to a manager?",
                 "This is ridiculous. Get me a human.", "Are you a bot? I need a human agent.",
                 "I've contacted you three times already and nothing has been fixed!",
                 "Let me talk to someone who can actually help."]))
    t = "CS-{}".format(r.randint(100000, 999999))
    c.a(pick(r, SORRY) + " " + pick(r, [
        "I've created a support ticket ({t}) and a member of our team will contact you at {e} "
        "within 24 hours.",
        "I'm an automated assistant, but I can pass this to our support team. Your ticket "
        "number is {t}, and someone will get back to you within one business day.",
        "You can reach our team by phone at {ph}, {h}. I've also opened ticket {t} so you "
        "don't have to explain everything again.",
    ]).format(t=t, e=w.email, ph=w.phone, h=w.hours))
    if r.random() < 0.5:
        c.follow_up(["Can't you just fix it now?", "How long will that take?", "fine."], [
            ("fix",
             "I'll do what I can right here. Tell me what's wrong with your order and I'll "
             "try to sort it out now; the ticket stays open either way."),
            ("long", lambda:
             "Our team usually replies within a few hours during support hours ({}).".format(
             w.hours)),
            (None, lambda:
             "Thanks for your patience, {}. We'll make this right.".format(w.first)),
        ])


def intent_small_talk(c):
    w, r = c.w, c.w.r
    q = pick(r, ["How are you today?", "Are you a robot?", "What's your name?",
                 "Tell me a joke.", "What's the weather like?", "Can you help me with my "
                 "homework?", "Who made you?", "You're really helpful!", "good morning!",
                 "What can you do?", "Do you like your job?", "what's the meaning of life?"])
    c.u(q)
    ql = q.lower()
    if "how are you" in ql:
        c.a("I'm doing well, thanks for asking! How can I help you today?")
    elif "robot" in ql or "who made" in ql:
        c.a("I'm {}'s virtual assistant. I can help with orders, shipping, returns and "
            "product questions, and I can connect you with our team if you need a person."
            .format(w.store))
    elif "name" in ql:
        c.a("I'm {}, the {} assistant. What can I do for you?".format(w.agent, w.store))
    elif "joke" in ql:
        c.a(pick(r, ["Why did the shoe go to the party alone? Because its sole mate was "
                     "running late! Now, how can I help you today?",
                     "Why don't packages ever get lost at sea? They always know their "
                     "tracking number! Is there anything I can help you with?"]))
    elif "helpful" in ql:
        c.a("Thank you, that's kind of you to say! Is there anything else I can help with?")
    elif "good morning" in ql:
        c.a("Good morning! How can I help you today?")
    elif "what can you do" in ql:
        c.a("I can track orders, explain shipping and return policies, start returns and "
            "exchanges, check refunds, answer product questions and help with your account. "
            "What do you need?")
    elif "like your job" in ql:
        c.a("I do! Helping customers find what they need is the best part. What can I help "
            "you with?")
    else:
        c.a("I'm afraid I can only help with questions about {} orders, products and your "
            "account. Is there something I can help you with there?".format(w.store))


def intent_recommend(c):
    w, r = c.w, c.w.r
    p = w.product()
    q = agree(p, pick(r, ["Can you recommend {a good|good} {k}?",
                          "I'm looking for {a |}{k} under ${b}.",
                          "What {is|are} your best-selling {k}?",
                          "I need a gift for my {rel}. Any ideas?"]))
    c.u(q.format(k=p["kind"], b=int(float(p["price"])) + r.randint(5, 40),
                 rel=pick(r, ["sister", "dad", "mom", "brother", "partner", "friend"])))
    c.a(agree(p, "I'd suggest the {}. {It has|They have} {} and {costs|cost} ${}.{}").format(
        p["name"], p["feats"][0], p["price"], agree(p, " {It comes|They come} in {}.").format(
            colour_list(p["colours"])) if r.random() < 0.6 else agree(p, " Customers love {it|them}.")))


INTENTS = [
    (intent_order_status, 16), (intent_delay, 9), (intent_return, 12), (intent_refund, 8),
    (intent_payment, 8), (intent_product, 16), (intent_account, 8), (intent_cancel, 6),
    (intent_damaged, 7), (intent_shipping_info, 6), (intent_gift_card, 3),
    (intent_escalation, 4), (intent_small_talk, 4), (intent_recommend, 5),
]


def greeting(c):
    w, r = c.w, c.w.r
    c.u(pick(r, ["Hi", "Hello", "hey there", "Hi, I need some help.", "Hello, is anyone there?",
                 "good afternoon", "Hi {agent}!"]).replace("{agent}", w.agent))
    c.a(pick(r, ["Hi! How can I help you today?", "Hello! Welcome to {store}. What can I do "
                 "for you?", "Hi there! I'm {agent}. How can I help?",
                 "Hello! What can I help you with today?", "Hey! How can I help?"]))


def conversation(r):
    default = r.random() < 0.15
    w = World(r, default_store=default)
    c = Convo(w)
    if r.random() < 0.15:
        greeting(c)
    fns = [f for f, _ in INTENTS]
    weights = [k for _, k in INTENTS]
    n = 1 if r.random() < 0.75 else 2
    for i in range(n):
        f = r.choices(fns, weights)[0]
        if i > 0:
            # a second topic starts with a short bridge from the customer
            before = len(c.turns)
            f(c)
            role, text = c.turns[before]
            for hello in ("Hi, ", "hi, ", "Hello, ", "hello, "):
                if text.startswith(hello):
                    text = text[len(hello):]
            bridge = pick(r, ["Also, ", "One more thing. ", "Another question: ", "And ", ""])
            if bridge.endswith(", ") or bridge == "And ":
                text = text[0].lower() + text[1:]
            c.turns[before] = (role, bridge + text[0].upper() + text[1:]
                               if bridge in ("", "One more thing. ", "Another question: ")
                               and r.random() < 0.8 else bridge + text)
        else:
            f(c)
    if r.random() < 0.45:
        c.u(pick(r, THANKS_USER))
        c.a(pick(r, CLOSE_ASSIST))
        if c.turns[-1][1].endswith("?") and r.random() < 0.7:
            c.u(pick(r, BYE_USER))
            c.a(pick(r, BYE_ASSIST))
    sys_text = DEFAULT_SYSTEM if default else system_prompt(w)
    msgs = [{"role": "system", "content": sys_text}]
    msgs.extend({"role": role, "content": text} for role, text in c.turns)
    return {"messages": msgs}


# ---------------------------------------------------------------- help-centre articles


def article(r):
    w = World(r)
    topic = r.randint(0, 5)
    if topic == 0:
        s = ("{s} shipping policy. Standard shipping takes {sd} business days and costs ${sc}. "
             "Orders over ${fs} ship free. Express shipping takes {ed} business days and costs "
             "${ec}. Orders placed before 2pm ship the same day.")
    elif topic == 1:
        s = ("Returns at {s}. You can return unused items within {rd} days of delivery. Start "
             "a return from the Orders page, print the prepaid label and drop the parcel at any "
             "carrier location. Refunds are issued within {rf} business days after the return "
             "arrives.")
    elif topic == 2:
        s = ("How to track your order. Once your order ships, {s} emails you a tracking number. "
             "You can also find it under Account > Orders. Tracking can take up to 24 hours to "
             "show the first update.")
    elif topic == 3:
        s = ("Payment methods. {s} accepts Visa, Mastercard, American Express, PayPal, Apple "
             "Pay and gift cards. If a payment is declined, check that the billing address "
             "matches your card, or contact your bank.")
    elif topic == 4:
        p = w.product()
        s = (agree(p, "The {n} {has|have} {f}. {It costs|They cost} ${pr} and {comes|come} in "
                      "{c}. ").format(n=p["name"], f=" and ".join(p["feats"]), pr=p["price"],
                                      c=colour_list(p["colours"]))
             + (agree(p, "Available in {}; {it fits|they fit} {}. ").format(size_range(p),
                                                                          p["fit"])
                if p["sizes"] else "") + "Free returns within {rd} days.")
    else:
        s = ("Contact {s}. Our support team is available {h}. Call us at {ph} or chat with our "
             "assistant any time. Have your order number ready so we can help you faster.")
    return {"text": s.format(s=w.store, sd=w.std_days, sc=w.std_cost, fs=w.free_ship,
                             ed=w.exp_days, ec=w.exp_cost, rd=w.return_days, rf=w.refund_days,
                             h=w.hours, ph=w.phone)}


def generate(seed, n, article_frac=0.05):
    """n records from `seed`; about `article_frac` of them are plain-text articles."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        out.append(article(r) if r.random() < article_frac else conversation(r))
    return out


if __name__ == "__main__":
    import json
    import sys

    for rec in generate(int(sys.argv[1]) if len(sys.argv) > 1 else 0, 5):
        print(json.dumps(rec, indent=1))
